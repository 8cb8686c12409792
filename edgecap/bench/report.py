"""Reading and writing a :class:`~edgecap.bench.results.BenchReport`: ``report.json`` (schema in
``docs/bench-report-schema.md``), and :func:`write_report` adds ``report.md`` (:mod:`edgecap.bench.markdown`) and the
plots (:mod:`edgecap.bench.plots`). Formatting never measures, measuring never formats. The report types live in
:mod:`edgecap.bench.results` and are importable from here too.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgecap.bench.results import (
    SCHEMA_VERSION,
    BenchReport,
    Breakdown,
    BundleInfo,
    ComboResult,
    LoopInfo,
    Quality,
    ReportError,
    SizeInfo,
    Skip,
    Throughput,
)
from edgecap.runtime._io import atomic_write_json, atomic_write_text

__all__ = [
    "SCHEMA_VERSION",
    "BenchReport",
    "Breakdown",
    "BundleInfo",
    "ComboResult",
    "LoopInfo",
    "Quality",
    "ReportError",
    "SizeInfo",
    "Skip",
    "Throughput",
    "load_report",
    "write_report",
]

#: How to get what the optional parts of a report (plots) need on a runtime-only install.
TRAIN_INSTALL = "pip install 'edgecap[train]'"


def load_report(path: str | Path) -> BenchReport:
    """Read and validate a ``report.json`` (a report directory also works).

    Raises:
        FileNotFoundError: no such file.
        ReportError: not JSON, or not a valid report (the message names the file and the field).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise FileNotFoundError(f"benchmark report not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: not a JSON benchmark report: {exc}") from exc
    return BenchReport.from_dict(data, str(path))


# -- writing ---------------------------------------------------------------------------------------------------------
def write_report(
    report: BenchReport, out_dir: str | Path, *, plots: bool = True, log: Callable[[str], Any] | None = None
) -> dict[str, Path]:
    """Write ``report.json``, the PNG plots (``plots=True``) and ``report.md`` (embedding them) into ``out_dir``;
    every file atomically.

    Returns:
        name -> path of every file written (``json``, ``latency_vs_batch``, ``pareto``, ``markdown``;
        ``compression_pareto`` when more than one variant records a CIDEr-D).
    """
    from edgecap.bench.markdown import format_markdown

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from edgecap.bench.environment import module_installed

    if plots and not module_installed("matplotlib"):  # a runtime-only install: the tables still go out
        note = f"PNG plots not written: they need matplotlib, which is not installed ({TRAIN_INSTALL})."
        report = dataclasses.replace(report, notes=[*report.notes, note])
        plots = False
        if log is not None:
            log(note)
    written: dict[str, Path] = {}
    atomic_write_json(out_dir / "report.json", report.to_dict())
    written["json"] = out_dir / "report.json"
    images: dict[str, Path] = {}
    if plots:
        from edgecap.bench.plots import plot_compression_pareto, plot_latency_vs_batch, plot_pareto

        for name, fn in (("latency_vs_batch", plot_latency_vs_batch), ("pareto", plot_pareto)):
            path = fn(report, out_dir / f"{name}.png")
            if path is not None:
                images[name] = path
            elif log is not None:
                log(f"{name}.png not written: nothing to plot")
        path = plot_compression_pareto(report, out_dir / "compression_pareto.png")  # silent: most reports have none
        if path is not None:
            images["compression_pareto"] = path
    written.update(images)
    atomic_write_text(out_dir / "report.md", format_markdown(report, images) + "\n")
    written["markdown"] = out_dir / "report.md"
    return written
