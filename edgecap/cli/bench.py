"""``edgecap bench``: latency, throughput, memory, size and quality of bundles across runtimes and precisions.

Thin: the flags (:mod:`edgecap.cli.bench_options`) become one :class:`~edgecap.bench.config.BenchCfg`;
:func:`~edgecap.bench.run.run_benchmark` measures and :func:`~edgecap.bench.report.write_report` writes.
``--compare A.json B.json`` calls :mod:`edgecap.bench.compare`; ``--runs N`` and ``--series`` call
:mod:`edgecap.bench.series`.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from edgecap.bench.config import BenchCfg
from edgecap.cli.bench_options import (
    INPUT_OPTIONS,
    OUTPUT_OPTIONS,
    TIMING_OPTIONS,
    WHAT_OPTIONS,
    WHERE_OPTIONS,
    bench_cfg,
)
from edgecap.cli.options import check_out, fail

__all__ = ["bench", "bench_cfg"]


def _command_line() -> str | None:
    args = sys.argv[1:]
    return shlex.join(["edgecap", *args]) if args[:1] == ["bench"] else None


def _compare(paths: tuple[Path, Path], out: Path | None) -> None:
    from edgecap.bench.compare import compare_reports, format_comparison
    from edgecap.bench.report import load_report
    from edgecap.runtime._io import atomic_write_json, atomic_write_text

    try:
        a, b = (load_report(p) for p in paths)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    comparison = compare_reports(a, b, labels=(str(paths[0]), str(paths[1])))
    text = format_comparison(comparison)
    click.echo(text)
    if out is not None:
        atomic_write_text(out / "compare.md", text + "\n")
        atomic_write_json(out / "compare.json", comparison.to_dict())
        click.echo(f"wrote {out / 'compare.md'} and {out / 'compare.json'}", err=True)


@click.command("bench")
@WHAT_OPTIONS
@INPUT_OPTIONS
@TIMING_OPTIONS
@WHERE_OPTIONS
@OUTPUT_OPTIONS
def bench(
    out: Path | None,
    compare: tuple[Path, Path] | None,
    series_reports: tuple[Path, ...],
    runs: int,
    target: float | None,
    quiet: bool,
    no_plots: bool,
    **flags: Any,
) -> None:
    """Benchmark bundles: single-stream latency, offline throughput, time split, memory, size and CIDEr-D.

    Two bundles of one run, one pixels-in and one with its backbone in torch, add the 'pixels-in vs torch backbone'
    headline ratio. Several bundles of one model compressed differently (pruned, 2:4, accuracy-aware INT8) add a
    table of each variant's recipe, size, batch-1 latency and recorded CIDEr-D, and compression_pareto.png
    (docs/compression.md).

    \b
    edgecap bench --bundle acort-bundle --batch 1,8,32 --beam 1,3 --out bench/
    edgecap bench --bundle labert-bundle --runtime onnxruntime --length-level all --out bench/
    edgecap bench --bundle pixels-in --bundle same-run-torch-backbone --runtime onnxruntime --precision int8 --out b/
    edgecap bench --bundle acort-bundle --runtime torch,onnxruntime --batch 1 --runs 10 --target 3 --out series/
    edgecap bench --bundle base --bundle pruned --bundle sparse --runtime onnxruntime --batch 1 --no-quality --out c/
    edgecap bench --compare laptop/report.json jetson/report.json
    edgecap bench --series series/run-01 --series series/run-02 --target 3
    """
    if compare or series_reports:
        if compare and series_reports:
            fail("--compare and --series are exclusive")
        if flags["bundles"]:
            fail(f"{'--compare' if compare else '--series'} reads existing reports; do not pass --bundle with it")
        if runs > 1:
            fail("--runs measures; --compare and --series read existing reports")
        if out is not None:
            check_out(out)
        if compare:
            _compare(compare, out)
        else:
            _series(series_reports, target, out)
        return
    if not flags["bundles"]:
        fail("give at least one --bundle DIR (or --compare A.json B.json, or --series REPORT ...)")
    if out is None:
        fail("--out DIR is required: where report.json, report.md and the plots go")
    if flags["images"] is not None and flags["synthetic"] is not None:
        fail("--images and --synthetic are exclusive: time on real images or on N synthetic inputs")
    if target is not None and runs == 1:
        fail("--target judges a series: give --runs N (N > 1) or --series REPORT ...")
    check_out(out)  # before the measuring: a report that cannot be written would lose it
    from edgecap.bench.report import write_report
    from edgecap.bench.run import run_benchmark

    try:
        cfg = bench_cfg(flags)
    except ValueError as exc:
        fail(str(exc))

    def measure(cfg: BenchCfg) -> Any:
        try:
            return run_benchmark(cfg, progress=not quiet, command=_command_line())
        except (ValueError, FileNotFoundError) as exc:
            fail(str(exc))

    if runs == 1:
        report = measure(cfg)
        written = write_report(report, out, plots=not no_plots, log=_log)
        click.echo(f"wrote {', '.join(str(p) for p in written.values())}")
        _summary(report)
        return
    from edgecap.bench.series import run_series

    def write(report: Any, run_dir: Path) -> None:
        write_report(report, run_dir, plots=not no_plots, log=_log)
        _summary(report)

    reports, dirs = run_series(cfg, runs, out, measure=measure, write=write, log=_log)
    _summarise(reports, dirs, target, out)


def _log(message: str) -> None:
    click.echo(message, err=True)


def _series(paths: tuple[Path, ...], target: float | None, out: Path | None) -> None:
    from edgecap.bench.report import load_report

    try:
        reports = [load_report(p) for p in paths]
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    _summarise(reports, paths, target, out)


def _summarise(reports: Sequence[Any], paths: Sequence[Path], target: float | None, out: Path | None) -> None:
    """Print the series table; with ``out`` also write ``series.md`` and ``series.json``."""
    from edgecap.bench.series import summarise_series, write_series

    try:
        summary = summarise_series(reports, paths, target)
    except ValueError as exc:
        fail(str(exc))
    click.echo("\n".join(summary.lines()))
    if out is not None:
        written = write_series(summary, out)
        click.echo(f"wrote {', '.join(str(p) for p in written.values())}", err=True)


def _summary(report: Any) -> None:
    """What was measured, skipped and failed; fails the command when nothing was measured."""
    click.echo(
        f"{len(report.results)} combination(s) measured, {len(report.skipped)} skipped, {len(report.errors)} failed"
    )
    for skip in report.skipped:
        click.echo(f"  skipped {skip.runtime} {skip.precision}: {skip.reason}", err=True)
    for error in report.errors:
        where = f" beam {error.beam} batch {error.batch}" if error.batch is not None else ""
        click.echo(f"  FAILED {error.runtime} {error.precision}{where}: {error.reason.splitlines()[0]}", err=True)
    if not report.results:
        fail("nothing was measured (see the skipped/failed combinations above)")
