"""A speed-up judged over a series of benchmark runs, not one: each headline ratio's median, range, and the runs
below a target (``edgecap bench --runs N [--target X]``, or ``--series`` over reports already written).

On a shared or thermally throttled machine one report's ONNX-Runtime-vs-torch ratio moves by ±15 % between runs, so
a target such as "ONNX Runtime FP32 beam-3 decoding at least 3× faster than torch eager at batch 1" is judged on N
runs. The runs are whole reports measured back to back, so the runtimes interleave (torch, onnxruntime, torch, …)
and a slow minute of the machine lands on both sides of a ratio instead of on one runtime's whole block. Each run is
an ordinary report (``OUT/run-NN``), its groups in fresh processes as usual; ``series.md`` and ``series.json`` go next
to them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecap.bench.config import BenchCfg
from edgecap.bench.ratios import BACKBONE_COMPARISON, RatioSeries, ratio_series, series_lines
from edgecap.bench.results import BenchReport
from edgecap.runtime._io import atomic_write_json, atomic_write_text

__all__ = ["SeriesSummary", "judged_span", "run_series", "summarise_series", "write_series"]


def judged_span(series: RatioSeries) -> str:
    """The span a target is judged on: end to end for pixels-in vs torch backbone (the backbone is what differs),
    the decoder loop (what a cached decoder or another runtime changes) for every other comparison."""
    return "end_to_end" if series.comparison == BACKBONE_COMPARISON else "loop"


@dataclass(frozen=True)
class SeriesSummary:
    """The headline ratios of several reports of the same configuration.

    Attributes:
        reports: where each report was read from or written to, in run order.
        target: the speed-up a run is counted against (on :func:`judged_span`), if any.
        series: one entry per comparison × model × beam × batch × subject/baseline.
    """

    reports: tuple[str, ...]
    target: float | None
    series: tuple[RatioSeries, ...]

    def lines(self) -> list[str]:
        """``series.md``: a heading line and the median (min–max) table."""
        return [
            f"Speed-ups over {len(self.reports)} report(s): median (min–max).",
            "",
            *series_lines(self.series, self.target, span=judged_span),
        ]

    def to_dict(self) -> dict[str, Any]:
        """``series.json``."""
        return {
            "reports": list(self.reports),
            "target": self.target,
            "series": [dataclasses.asdict(s) for s in self.series],
        }


def summarise_series(
    reports: Sequence[BenchReport], paths: Sequence[str | Path], target: float | None = None
) -> SeriesSummary:
    """Group the reports' headline ratios into series.

    Raises:
        ValueError: no comparison in these reports (each comparison needs both of its runtimes measured).
    """
    series = ratio_series((r.results, r.bundles) for r in reports)
    if not series:
        raise ValueError(
            "no comparison found in these reports (each needs both sides of a comparison, e.g. --runtime "
            "torch,onnxruntime at fp32)"
        )
    return SeriesSummary(tuple(str(p) for p in paths), target, tuple(series))


def write_series(summary: SeriesSummary, out_dir: str | Path) -> dict[str, Path]:
    """Write ``series.md`` and ``series.json`` into ``out_dir`` (atomically); returns name -> path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "series.md", "\n".join(summary.lines()) + "\n")
    atomic_write_json(out_dir / "series.json", summary.to_dict())
    return {"markdown": out_dir / "series.md", "json": out_dir / "series.json"}


def run_series(
    cfg: BenchCfg,
    runs: int,
    out_dir: str | Path,
    *,
    measure: Callable[[BenchCfg], BenchReport],
    write: Callable[[BenchReport, Path], Any],
    log: Callable[[str], Any] | None = None,
) -> tuple[list[BenchReport], list[Path]]:
    """Measure ``cfg`` ``runs`` times back to back, each report written into ``out_dir/run-NN`` as it finishes (an
    interrupted series keeps the runs it completed).

    Args:
        measure: one run (:func:`~edgecap.bench.run.run_benchmark` with the caller's progress and command line).
        write: writes one report into a directory (:func:`~edgecap.bench.report.write_report` with its options).
        log: told after each run, with the machine's load average (a busy neighbour shows there).
    """
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    reports, dirs = [], []
    for i in range(runs):
        run_dir = Path(out_dir) / f"run-{i + 1:02d}"
        report = measure(cfg)
        write(report, run_dir)
        reports.append(report)
        dirs.append(run_dir)
        if log is not None:
            load = f"  (load {os.getloadavg()[0]:.2f})" if hasattr(os, "getloadavg") else ""
            log(f"run {i + 1}/{runs}: {run_dir}{load}")
    return reports, dirs
