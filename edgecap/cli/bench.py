"""``edgecap bench``: latency, throughput, memory, size and quality of bundles across runtimes and precisions.

Thin: parse flags into a :class:`~edgecap.bench.run.BenchCfg`, call :func:`~edgecap.bench.run.run_benchmark` and
:func:`~edgecap.bench.report.write_report`; ``--compare A.json B.json`` calls :mod:`edgecap.bench.compare`.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from edgecap.cli.options import fail
from edgecap.decoding.config import MAX_BEAM
from edgecap.runtimes.registry import list_runtimes


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
    from edgecap._io import atomic_write_json, atomic_write_text
    from edgecap.bench.compare import compare_reports, format_comparison
    from edgecap.bench.report import load_report

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
@click.option(
    "--bundle", "bundles", multiple=True, type=click.Path(path_type=Path), help="Bundle directory (repeatable)."
)
@click.option(
    "--runtime",
    "runtimes",
    multiple=True,
    help="Runtimes, comma-separated or repeated: any registered one ("
    + ", ".join(list_runtimes())
    + "; torch-rerun re-runs the whole prefix each step: the baseline of the speed-up column). Default: torch, "
    "torch-rerun, onnxruntime; one not installed here is skipped with what to install.",
)
@click.option(
    "--precision",
    "precisions",
    multiple=True,
    help="fp32, fp16, int8 (comma-separated). Default: all the bundle holds.",
)
@click.option("--batch", "batches", multiple=True, help="Batch sizes, e.g. 1,8,32 (1 = single-stream). Default 1,8.")
@click.option(
    "--beam",
    "beams",
    multiple=True,
    help=f"Beam sizes, e.g. 1,3,5 (1 = greedy; at most {MAX_BEAM}). Default: the bundle's.",
)
@click.option(
    "--length-level",
    "length_levels",
    multiple=True,
    help="Length levels of length-controllable bundles (LaBERT, *-len), e.g. 1,4 or 'all'. Default: the bundle's.",
)
@click.option(
    "--images", type=click.Path(path_type=Path), default=None, help="Time on these images (bundles with a backbone)."
)
@click.option("--synthetic", type=click.IntRange(1), default=None, help="Time on N synthetic inputs (default 32).")
@click.option("--max-images", type=click.IntRange(1), default=None, help="Use at most N files of --images (64).")
@click.option(
    "--quality-data",
    type=click.Path(path_type=Path),
    default=None,
    help="Dataset directory for CIDEr-D (default: the bundle's training dataset when present).",
)
@click.option(
    "--quality-features",
    type=click.Path(path_type=Path),
    default=None,
    help="Region-feature directory for --quality-data (bundles that caption region features).",
)
@click.option("--quality-images", type=click.IntRange(1), default=100, show_default=True, help="Quality subset size.")
@click.option("--no-quality", is_flag=True, help="Skip the CIDEr-D runs.")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True, help="Untimed queries first.")
@click.option("--min-repeats", type=click.IntRange(1), default=10, show_default=True, help="Timed queries at least.")
@click.option("--min-seconds", type=click.FloatRange(0), default=2.0, show_default=True, help="Timed seconds at least.")
@click.option("--max-repeats", type=click.IntRange(1), default=10_000, show_default=True, help="Timed queries at most.")
@click.option("--threads", type=click.IntRange(1), default=None, help="CPU threads (torch and ONNX Runtime).")
@click.option("--device", default=None, help="torch device: cpu, cuda, cuda:N (default: CUDA when available).")
@click.option("--providers", default=None, help="ONNX Runtime providers, e.g. cuda,cpu (default: best available).")
@click.option(
    "--step-mode",
    type=click.Choice(["eager", "static", "cuda-graph", "compile", "auto"]),
    default="eager",
    show_default=True,
    help="How the torch runtime runs a decoder step (cuda-graph: captured once per batch shape; see docs/gpu.md).",
)
@click.option(
    "--tegrastats/--no-tegrastats",
    default=True,
    show_default=True,
    help="Sample tegrastats (Jetson power rails, unified memory) during timed runs where it is installed.",
)
@click.option(
    "--no-isolate",
    is_flag=True,
    help="Run everything in this process (faster; memory baselines then include earlier models).",
)
@click.option("--no-plots", is_flag=True, help="Write report.json and report.md only.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic inputs.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Report directory.")
@click.option(
    "--compare",
    nargs=2,
    type=click.Path(path_type=Path),
    default=None,
    help="Compare two report.json files (A B) instead of measuring; with --out also writes compare.md/json.",
)
def bench(
    bundles: tuple[Path, ...],
    runtimes: tuple[str, ...],
    precisions: tuple[str, ...],
    batches: tuple[str, ...],
    beams: tuple[str, ...],
    length_levels: tuple[str, ...],
    images: Path | None,
    synthetic: int | None,
    max_images: int | None,
    quality_data: Path | None,
    quality_features: Path | None,
    quality_images: int,
    no_quality: bool,
    warmup: int,
    min_repeats: int,
    min_seconds: float,
    max_repeats: int,
    threads: int | None,
    device: str | None,
    providers: str | None,
    step_mode: str,
    tegrastats: bool,
    no_isolate: bool,
    no_plots: bool,
    seed: int,
    quiet: bool,
    out: Path | None,
    compare: tuple[Path, Path] | None,
) -> None:
    """Benchmark bundles: single-stream latency, offline throughput, time split, memory, size and CIDEr-D.

    Two bundles of one run, one pixels-in and one with its backbone in torch, add the 'pixels-in vs torch backbone'
    headline ratio.

    \b
    edgecap bench --bundle acort-bundle --batch 1,8,32 --beam 1,3 --out bench/
    edgecap bench --bundle labert-bundle --runtime onnxruntime --length-level all --out bench/
    edgecap bench --bundle pixels-in --bundle same-run-torch-backbone --runtime onnxruntime --precision int8 --out b/
    edgecap bench --compare laptop/report.json jetson/report.json
    """
    if compare:
        if bundles:
            fail("--compare reads two existing reports; do not pass --bundle with it")
        _compare(compare, out)
        return
    if not bundles:
        fail("give at least one --bundle DIR (or --compare A.json B.json)")
    if out is None:
        fail("--out DIR is required: where report.json, report.md and the plots go")
    if images is not None and synthetic is not None:
        fail("--images and --synthetic are exclusive: time on real images or on N synthetic inputs")
    from edgecap.bench.report import write_report
    from edgecap.bench.run import BenchCfg, run_benchmark

    try:
        flags = {
            "runtimes": tuple(_split(runtimes)),
            "precisions": tuple(_split(precisions)),
            "batches": tuple(_ints(batches, "--batch")),
            "beams": tuple(_ints(beams, "--beam")),
            "length_levels": _levels(length_levels),
            "images": str(images) if images else None,
            "synthetic": synthetic,
            "max_images": max_images,
            "quality_data": str(quality_data) if quality_data else None,
            "quality_features": str(quality_features) if quality_features else None,
            "threads": threads,
            "device": device,
            "providers": tuple(_split([providers])) if providers else None,
        }
        cfg = BenchCfg(
            bundles=tuple(str(b) for b in bundles),
            quality=not no_quality,
            quality_images=quality_images,
            warmup=warmup,
            min_repeats=min_repeats,
            min_seconds=min_seconds,
            max_repeats=max_repeats,
            isolate=not no_isolate,
            tegrastats=tegrastats,
            step_mode=step_mode,
            seed=seed,
            **{k: v for k, v in flags.items() if v not in (None, ())},  # unset flags keep BenchCfg's defaults
        )
        report = run_benchmark(cfg, progress=not quiet, command=_command_line())
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    written = write_report(report, out, plots=not no_plots, log=lambda m: click.echo(m, err=True))
    click.echo(f"wrote {', '.join(str(p) for p in written.values())}")
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
