"""``edgecap export``: a trained run -> a verified bundle (FP32, optionally FP16 and calibrated INT8)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from edgecap.cli.options import FiniteFloat, apply_threads, fail, option_group, threads_option


class _PresetChoice(click.Choice):
    """The INT8 targets, read from the preset registry when the option is parsed or its help shown (a preset
    registered after this module was imported is accepted). The registry module is light: no torch or onnx."""

    def __init__(self) -> None:
        super().__init__((), case_sensitive=True)

    @property  # type: ignore[override]  # click declares a plain attribute; a read-through property serves it
    def choices(self) -> Sequence[str]:
        from edgecap.workshop.export.calibration.presets import list_presets

        return tuple(list_presets())

    @choices.setter
    def choices(self, value: Sequence[str]) -> None:  # click.Choice.__init__ assigns; the registry is the source
        pass


class _StepSchemeChoice(_PresetChoice):
    """The named step schemes of ``edgecap.workshop.export.calibration.presets.STEP_SCHEMES``."""

    @property  # type: ignore[override]  # as _PresetChoice.choices
    def choices(self) -> Sequence[str]:
        from edgecap.workshop.export.calibration.presets import STEP_SCHEMES

        return tuple(STEP_SCHEMES)

    @choices.setter
    def choices(self, value: Sequence[str]) -> None:
        pass


_VARIANTS = option_group(
    click.option("--fp16", is_flag=True, help="Also export float16 graphs (GPU/NPU targets)."),
    click.option("--int8", is_flag=True, help="Also export INT8 (QDQ) graphs calibrated on --calib."),
    click.option(
        "--calib",
        type=click.Path(exists=True, path_type=Path),
        default=None,
        help="Calibration images: a folder of images or a dataset directory (its train split).",
    ),
    click.option(
        "--target",
        type=_PresetChoice(),
        default="cpu-auto",
        show_default=True,
        help="INT8 preset: any registered edgecap.workshop.export.calibration preset (register_preset() adds one); "
        "cpu-auto picks the preset of this machine's CPU.",
    ),
    click.option(
        "--calib-size", type=click.IntRange(1), default=256, show_default=True, help="Calibrate on at most N images."
    ),
    click.option(
        "--int8-step",
        type=_StepSchemeChoice(),
        default=None,
        help="How the decoder step (LaBERT: refine) graph is quantised: static (calibrated QDQ), dynamic "
        "(MatMulInteger), weight-only (8-bit MatMulNBits) or weight-only-4. [default: the target preset's choice; "
        "docs/int8.md]",
    ),
    click.option(
        "--max-cider-drop",
        type=FiniteFloat(0.0, 100.0),
        default=None,
        help="Accuracy-aware INT8: at most D CIDEr-D points (the 0-100 scale printed, e.g. 0.3) below torch FP32 on "
        "the held-out set; the fewest most-sensitive layers stay float until it holds, else nothing is written.",
    ),
    click.option(
        "--min-agreement",
        type=FiniteFloat(0.0, 1.0),
        default=None,
        help="Accuracy-aware INT8: at least this fraction (0-1, e.g. 0.85) of held-out captions identical to torch "
        "FP32's (with --max-cider-drop, both must hold).",
    ),
)
_GRAPHS = option_group(
    click.option(
        "--with-backbone/--features-in",
        "with_backbone",
        default=None,
        help="Pixels in: the image backbone in the encoder graph (input pixel_values), or features in: the encoder "
        "takes backbone features and the backbone runs in torch. [default: pixels in when the run was trained on a "
        "backbone's features with packaged or file weights; features in for region-feature runs]",
    ),
    click.option(
        "--backbone-weights",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="Local backbone weights, when the run's features were made with a weights file (the bundle carries it).",
    ),
    click.option(
        "--quality-images",
        type=click.IntRange(0),
        default=100,
        show_default=True,
        help="Held-out images for the task-level check of each variant (0 skips it).",
    ),
    click.option("--overwrite", is_flag=True, help="Replace an existing --out (atomically)."),
)


@click.command("export")
@click.option(
    "--model",
    "model",
    required=True,
    help="A model name trained earlier (`edgecap train`/`quickstart`), a run directory, or a bundle to re-export.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Bundle directory [default: $EDGECAP_HOME/bundles/MODEL, where an existing bundle is replaced atomically "
    "once the new one is verified].",
)
@_VARIANTS
@_GRAPHS
@click.option("--quiet", is_flag=True, help="No progress output.")
@threads_option
def export(model: str, out: Path | None, quiet: bool, threads: int, **options: Any) -> None:
    """Export a trained MODEL to a bundle: ONNX graphs checked for parity, manifest with checksums and quality.

    Pixels in by default (the backbone inside the encoder graph), written to $EDGECAP_HOME/bundles/MODEL unless --out.
    """
    if options["int8"] and options["calib"] is None:
        raise click.UsageError("--int8 needs calibration images: --calib DIR")
    if options["calib"] is not None and not options["int8"]:
        raise click.UsageError("--calib is only used with --int8")
    if options["int8_step"] is not None and not options["int8"]:
        raise click.UsageError("--int8-step is only used with --int8")
    for flag in ("max_cider_drop", "min_agreement"):
        if options[flag] is not None and not options["int8"]:
            raise click.UsageError(f"--{flag.replace('_', '-')} selects INT8 layers: it is only used with --int8")
    if (options["max_cider_drop"] is not None or options["min_agreement"] is not None) and not options[
        "quality_images"
    ]:
        raise click.UsageError("--max-cider-drop/--min-agreement are checked on the held-out set: --quality-images > 0")
    apply_threads(threads)
    from edgecap.runtime.bundle.layout import is_bundle
    from edgecap.runtime.bundle.reader import load_bundle
    from edgecap.workshop.export.bundle import ExportRequest, default_bundle_out, export_request

    try:
        replacing = out is None and is_bundle(default_bundle_out(model))
        path = export_request(model, out, ExportRequest(progress=not quiet, **options))
        bundle = load_bundle(path, verify=False, graphs="none")
    except (ValueError, FileNotFoundError, FileExistsError, ImportError, PermissionError) as exc:
        fail(str(exc))
    print_bundle_table(bundle)
    if replacing:
        click.echo(f"replaced the existing bundle at {path}")
    click.echo(f"bundle written to {path}; try `edgecap caption IMAGE --model {path}`")


def print_bundle_table(bundle: object) -> None:
    """The per-variant parity/quality table of a bundle (also used by ``edgecap quickstart``)."""
    from rich.console import Console

    from edgecap.workshop.export.report import bundle_table

    Console(highlight=False).print(bundle_table(bundle))
