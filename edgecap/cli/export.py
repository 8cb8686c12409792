"""``edgecap export``: a trained run -> a verified bundle (FP32, optionally FP16 and calibrated INT8)."""

from __future__ import annotations

from pathlib import Path

import click

from edgecap.cli.options import apply_threads, fail, threads_option

# Kept here (not imported from edgecap.bundle.export) so `edgecap export --help` does not import torch.
_TARGETS = ("cpu-auto", "cpu-avx2", "cpu-vnni", "arm64", "tensorrt")


@click.command("export")
@click.option(
    "--model",
    "model",
    required=True,
    help="A model name trained earlier (`edgecap train`/`quickstart`), a run directory, or a bundle to re-export.",
)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Bundle directory.")
@click.option("--fp16", is_flag=True, help="Also export float16 graphs (GPU/NPU targets).")
@click.option("--int8", is_flag=True, help="Also export INT8 (QDQ) graphs calibrated on --calib.")
@click.option(
    "--calib",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Calibration images: a folder of images or a dataset directory (its train split).",
)
@click.option(
    "--target",
    type=click.Choice(_TARGETS),
    default="cpu-auto",
    show_default=True,
    help="INT8 preset: this CPU (cpu-auto), x86 without/with VNNI, 64-bit ARM, or TensorRT.",
)
@click.option(
    "--calib-size", type=click.IntRange(1), default=256, show_default=True, help="Calibrate on at most N images."
)
@click.option("--with-backbone", is_flag=True, help="Put the image backbone in the encoder graph (pixels in).")
@click.option(
    "--backbone-weights",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Local backbone weights, when the run's features were made with a weights file (the bundle carries it).",
)
@click.option(
    "--quality-images",
    type=click.IntRange(0),
    default=100,
    show_default=True,
    help="Held-out images for the task-level check of each variant (0 skips it).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing bundle (atomically).")
@click.option("--quiet", is_flag=True, help="No progress output.")
@threads_option
def export(
    model: str,
    out: Path,
    fp16: bool,
    int8: bool,
    calib: Path | None,
    target: str,
    calib_size: int,
    with_backbone: bool,
    backbone_weights: Path | None,
    quality_images: int,
    overwrite: bool,
    quiet: bool,
    threads: int,
) -> None:
    """Export a trained MODEL to a bundle: ONNX graphs checked for parity, manifest with checksums and quality."""
    if int8 and calib is None:
        raise click.UsageError("--int8 needs calibration images: --calib DIR")
    if calib is not None and not int8:
        raise click.UsageError("--calib is only used with --int8")
    apply_threads(threads)
    from edgecap.bundle.export import export_bundle
    from edgecap.bundle.reader import load_bundle

    try:
        path = export_bundle(
            model,
            out,
            fp16=fp16,
            int8=int8,
            calib=calib,
            target=target,
            calib_size=calib_size,
            with_backbone=with_backbone,
            overwrite=overwrite,
            progress=not quiet,
            backbone_weights=backbone_weights,
            quality_images=quality_images,
        )
        bundle = load_bundle(path, verify=False, graphs="none")
    except (ValueError, FileNotFoundError, FileExistsError, ImportError) as exc:
        fail(str(exc))
    print_bundle_table(bundle)
    click.echo(f"bundle written to {path}; try `edgecap caption IMAGE --model {path}`")


def print_bundle_table(bundle: object) -> None:
    """The per-variant parity/quality table of a bundle (also used by ``edgecap quickstart``)."""
    from rich.console import Console

    from edgecap.bundle.report import bundle_table

    Console(highlight=False).print(bundle_table(bundle))
