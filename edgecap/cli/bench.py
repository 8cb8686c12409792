"""``edgecap bench``: latency, throughput, memory, size and quality of bundles across runtimes and precisions.

Thin: the flags, in groups (what to measure, on which inputs, how long, where), become one
:class:`~edgecap.bench.config.BenchCfg`; :func:`~edgecap.bench.run.run_benchmark` measures and
:func:`~edgecap.bench.report.write_report` writes. ``--compare A.json B.json`` calls :mod:`edgecap.bench.compare`;
``--runs N`` and ``--series`` call :mod:`edgecap.bench.series`. Every default the help names is read from
``BenchCfg`` or the registries, so the help cannot drift from what runs.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from edgecap.bench.config import STEP_MODE_CHOICES, BenchCfg
from edgecap.cli.options import check_out, fail, onnxruntime_threads_options, option_group
from edgecap.runtime.backends.onnxruntime.gpu import DEFAULT_TRT_OPT_BATCH
from edgecap.runtime.backends.registry import list_runtimes
from edgecap.runtime.decoding.config import MAX_BEAM
from edgecap.runtime.precisions import PRECISIONS

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(BenchCfg) if f.default is not dataclasses.MISSING}


def _listed(values: Sequence[object]) -> str:
    return ",".join(str(v) for v in values)


def _split(values: Sequence[str]) -> list[str]:
    """``("torch,onnxruntime", "torch-rerun")`` -> ``["torch", "onnxruntime", "torch-rerun"]`` (repeatable and
    comma-separated)."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def _ints(values: Sequence[str], flag: str) -> list[int]:
    out = []
    for item in _split(values):
        try:
            number = int(item)
        except ValueError:
            raise click.BadParameter(f"expected integers like 1,8,32, got {item!r}", param_hint=flag) from None
        if number < 1:
            raise click.BadParameter(f"must be >= 1, got {number}", param_hint=flag)
        out.append(number)
    return out


def _levels(values: Sequence[str]) -> tuple[int, ...] | str | None:
    """``--length-level``: ``all``, or levels like ``1,4``; None when not given."""
    if list(_split(values)) == ["all"]:
        return "all"
    return tuple(_ints(values, "--length-level")) or None


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


_WHAT = option_group(
    click.option(
        "--bundle", "bundles", multiple=True, type=click.Path(path_type=Path), help="Bundle directory (repeatable)."
    ),
    click.option(
        "--runtime",
        "runtimes",
        multiple=True,
        help="Runtimes, comma-separated or repeated: any registered one ("
        + ", ".join(list_runtimes())
        + "; torch-rerun re-runs the whole prefix each step: the baseline of the speed-up column). Default: every "
        "registered runtime; one not installed here is skipped with what to install.",
    ),
    click.option(
        "--precision",
        "precisions",
        multiple=True,
        help=", ".join(PRECISIONS) + " (comma-separated). Default: all the bundle holds.",
    ),
    click.option(
        "--batch",
        "batches",
        multiple=True,
        help=f"Batch sizes, e.g. 1,8,32 (1 = single-stream). Default {_listed(_DEFAULTS['batches'])}.",
    ),
    click.option(
        "--beam",
        "beams",
        multiple=True,
        help=f"Beam sizes, e.g. 1,3,5 (1 = greedy; at most {MAX_BEAM}). Default: the bundle's.",
    ),
    click.option(
        "--length-level",
        "length_levels",
        multiple=True,
        help="Length levels of length-controllable bundles (LaBERT, *-len), e.g. 1,4 or 'all'. Default: the bundle's.",
    ),
)
_INPUTS = option_group(
    click.option(
        "--images",
        type=click.Path(path_type=Path),
        default=None,
        help="Time on these images (bundles with a backbone).",
    ),
    click.option(
        "--synthetic",
        type=click.IntRange(1),
        default=None,
        help=f"Time on N synthetic inputs (default {_DEFAULTS['synthetic']}).",
    ),
    click.option(
        "--max-images",
        type=click.IntRange(1),
        default=None,
        help=f"Use at most N files of --images (default {_DEFAULTS['max_images']}).",
    ),
    click.option(
        "--quality-data",
        type=click.Path(path_type=Path),
        default=None,
        help="Dataset directory for CIDEr-D (default: the bundle's training dataset when present).",
    ),
    click.option(
        "--quality-features",
        type=click.Path(path_type=Path),
        default=None,
        help="Region-feature directory for --quality-data (bundles that caption region features).",
    ),
    click.option(
        "--quality-images",
        type=click.IntRange(1),
        default=_DEFAULTS["quality_images"],
        show_default=True,
        help="Quality subset size.",
    ),
    click.option("--no-quality", is_flag=True, help="Skip the CIDEr-D runs."),
    click.option(
        "--seed", type=int, default=_DEFAULTS["seed"], show_default=True, help="Seed of the synthetic inputs."
    ),
)
_TIMING = option_group(
    click.option(
        "--warmup",
        type=click.IntRange(0),
        default=_DEFAULTS["warmup"],
        show_default=True,
        help="Untimed queries first.",
    ),
    click.option(
        "--min-repeats",
        type=click.IntRange(1),
        default=_DEFAULTS["min_repeats"],
        show_default=True,
        help="Timed queries at least.",
    ),
    click.option(
        "--min-seconds",
        type=click.FloatRange(0),
        default=_DEFAULTS["min_seconds"],
        show_default=True,
        help="Timed seconds at least.",
    ),
    click.option(
        "--max-repeats",
        type=click.IntRange(1),
        default=_DEFAULTS["max_repeats"],
        show_default=True,
        help="Timed queries at most.",
    ),
    click.option(
        "--runs",
        type=click.IntRange(1),
        default=1,
        show_default=True,
        help="Measure everything N times back to back (the runtimes interleave), each report into OUT/run-NN, and "
        "write OUT/series.md and series.json: each headline speed-up's median (min–max) over the runs. Judge a "
        "ratio on a series on a shared machine: one report's moves by ±15 %.",
    ),
    click.option(
        "--target",
        type=click.FloatRange(0, min_open=True),
        default=None,
        help="With --runs or --series: count the runs whose speed-up is below this (decoder loop; end to end for "
        "pixels-in vs torch backbone).",
    ),
)
_WHERE = option_group(
    onnxruntime_threads_options(default=None),
    click.option("--device", default=None, help="torch device: cpu, cuda, cuda:N (default: CUDA when available)."),
    click.option("--providers", default=None, help="ONNX Runtime providers, e.g. cuda,cpu (default: best available)."),
    click.option(
        "--trt-opt-batch",
        type=click.IntRange(1),
        default=None,
        help="ONNX Runtime's TensorRT provider: images per call its engines are tuned for (default "
        f"{DEFAULT_TRT_OPT_BATCH}; the engines still take every batch measured).",
    ),
    click.option(
        "--step-mode",
        type=click.Choice(STEP_MODE_CHOICES),
        default=_DEFAULTS["step_mode"],
        show_default=True,
        help="How the torch runtime runs a decoder step (cuda-graph: captured once per batch shape; see docs/gpu.md).",
    ),
    click.option(
        "--tegrastats/--no-tegrastats",
        default=_DEFAULTS["tegrastats"],
        show_default=True,
        help="Sample tegrastats (Jetson power rails, unified memory) during timed runs where it is installed.",
    ),
    click.option(
        "--no-isolate",
        is_flag=True,
        help="Run everything in this process (faster; memory baselines then include earlier models).",
    ),
)
_OUTPUT = option_group(
    click.option("--no-plots", is_flag=True, help="Write report.json and report.md only."),
    click.option("--quiet", is_flag=True, help="No progress bar."),
    click.option("--out", type=click.Path(path_type=Path), default=None, help="Report directory."),
    click.option(
        "--compare",
        nargs=2,
        type=click.Path(path_type=Path),
        default=None,
        help="Compare two report.json files (A B) instead of measuring; with --out also writes compare.md/json.",
    ),
    click.option(
        "--series",
        "series_reports",
        multiple=True,
        type=click.Path(path_type=Path),
        help="Summarise these reports (report.json or its directory; repeatable) as a series instead of measuring, "
        "as --runs does; with --out also writes series.md/json.",
    ),
)


def bench_cfg(flags: dict[str, Any]) -> BenchCfg:
    """The :class:`~edgecap.bench.config.BenchCfg` the measuring flags describe (unset ones keep its defaults).

    Raises:
        click.BadParameter: a malformed list (``--batch 1,x``).
        ValueError: a combination ``BenchCfg`` refuses.
    """
    optional = {
        "runtimes": tuple(_split(flags["runtimes"])),
        "precisions": tuple(_split(flags["precisions"])),
        "batches": tuple(_ints(flags["batches"], "--batch")),
        "beams": tuple(_ints(flags["beams"], "--beam")),
        "length_levels": _levels(flags["length_levels"]),
        "images": str(flags["images"]) if flags["images"] else None,
        "synthetic": flags["synthetic"],
        "max_images": flags["max_images"],
        "quality_data": str(flags["quality_data"]) if flags["quality_data"] else None,
        "quality_features": str(flags["quality_features"]) if flags["quality_features"] else None,
        "threads": flags["threads"],
        "spin": flags["spin"],
        "device": flags["device"],
        "providers": tuple(_split([flags["providers"]])) if flags["providers"] else None,
        "trt_opt_batch": flags["trt_opt_batch"],
    }
    return BenchCfg(
        bundles=tuple(str(b) for b in flags["bundles"]),
        quality=not flags["no_quality"],
        quality_images=flags["quality_images"],
        warmup=flags["warmup"],
        min_repeats=flags["min_repeats"],
        min_seconds=flags["min_seconds"],
        max_repeats=flags["max_repeats"],
        isolate=not flags["no_isolate"],
        tegrastats=flags["tegrastats"],
        step_mode=flags["step_mode"],
        seed=flags["seed"],
        **{k: v for k, v in optional.items() if v not in (None, ())},
    )


@click.command("bench")
@_WHAT
@_INPUTS
@_TIMING
@_WHERE
@_OUTPUT
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
    headline ratio.

    \b
    edgecap bench --bundle acort-bundle --batch 1,8,32 --beam 1,3 --out bench/
    edgecap bench --bundle labert-bundle --runtime onnxruntime --length-level all --out bench/
    edgecap bench --bundle pixels-in --bundle same-run-torch-backbone --runtime onnxruntime --precision int8 --out b/
    edgecap bench --bundle acort-bundle --runtime torch,onnxruntime --batch 1 --runs 10 --target 3 --out series/
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
