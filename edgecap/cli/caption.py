"""``edgecap caption``: describe images with a bundle or a trained run."""

from __future__ import annotations

from pathlib import Path

import click

from edgecap.cli.options import beam_option, device_option, fail


@click.command("caption")
@click.argument("images", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--model",
    "model",
    default="acort-xsmall",
    show_default=True,
    help="A bundle directory (`edgecap export`), a run directory, or a model name trained earlier.",
)
@beam_option
@click.option(
    "--runtime",
    type=click.Choice(["auto", "ort", "torch"]),
    default="auto",
    show_default=True,
    help="Bundles: ONNX Runtime (auto when installed) or the torch weights. Runs always use torch.",
)
@click.option(
    "--precision",
    type=click.Choice(["auto", "fp32", "fp16", "int8"]),
    default="auto",
    show_default=True,
    help="Bundles: which exported variant (auto = the best for the runtime).",
)
@click.option(
    "--backbone-weights",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Local backbone weights, when the run's features were made with a weights file.",
)
@click.option(
    "--length-level",
    type=click.IntRange(1),
    default=None,
    help="Caption length level (1 = shortest; LaBERT and *-len models): 4-level plan 1-9, 10-14, 15-19, 20-25 words.",
)
@click.option("--json", "as_json", is_flag=True, help="Print {image: caption} as JSON.")
@device_option
def caption(
    images: tuple[Path, ...],
    model: str,
    beam: int,
    runtime: str,
    precision: str,
    backbone_weights: Path | None,
    length_level: int | None,
    as_json: bool,
    device: str,
) -> None:
    """Caption IMAGES with a bundle or a trained model."""
    import json

    from edgecap.bundle.reader import is_bundle
    from edgecap.captioner import Captioner
    from edgecap.runtimes.torch import resolve_device

    try:
        if is_bundle(model):
            captioner = Captioner.load(
                model, runtime=runtime, precision=precision, beam=beam, device=None if device == "auto" else device
            )
            if not as_json:
                click.echo(f"runtime: {captioner.runtime_info['summary']}", err=True)
        else:
            if runtime == "ort" or precision not in ("auto", "fp32"):
                fail(
                    f"{model} is a trained run, which runs on torch at FP32; --runtime ort and --precision "
                    f"fp16/int8 need a bundle: `edgecap export --model {model}` (written to "
                    "$EDGECAP_HOME/bundles/NAME; --out BUNDLE to choose)"
                )
            captioner = Captioner.from_run(
                model, device=str(resolve_device(device)), beam=beam, backbone_weights=backbone_weights
            )
        with captioner:
            captions = captioner.batch([str(p) for p in images], length_level=length_level)
    except (ValueError, FileNotFoundError, RuntimeError, ImportError) as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps({str(p): c for p, c in zip(images, captions, strict=True)}, indent=2))
    else:
        for path, text in zip(images, captions, strict=True):
            click.echo(f"{path}: {text}")
