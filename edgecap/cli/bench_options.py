"""The flags of ``edgecap bench``, in groups (what to measure, on which inputs, how long, where, output), and the
:class:`~edgecap.bench.config.BenchCfg` the measuring ones describe.

Every default the help names is read from ``BenchCfg`` or the registries, so the help cannot drift from what runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from edgecap.bench.config import STEP_MODE_CHOICES, BenchCfg
from edgecap.cli.options import FiniteFloat, onnxruntime_threads_options, option_group
from edgecap.runtime.backends.onnxruntime.gpu import DEFAULT_TRT_OPT_BATCH
from edgecap.runtime.backends.registry import list_runtimes
from edgecap.runtime.decoding.config import MAX_BEAM
from edgecap.runtime.precisions import PRECISIONS

__all__ = ["INPUT_OPTIONS", "OUTPUT_OPTIONS", "TIMING_OPTIONS", "WHAT_OPTIONS", "WHERE_OPTIONS", "bench_cfg"]

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


WHAT_OPTIONS = option_group(
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
INPUT_OPTIONS = option_group(
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
TIMING_OPTIONS = option_group(
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
        type=FiniteFloat(0),
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
        type=FiniteFloat(0, min_open=True),
        default=None,
        help="With --runs or --series: count the runs whose speed-up is below this (decoder loop; end to end for "
        "pixels-in vs torch backbone).",
    ),
)
WHERE_OPTIONS = option_group(
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
OUTPUT_OPTIONS = option_group(
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
