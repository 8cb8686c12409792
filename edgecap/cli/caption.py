"""``edgecap caption``: describe images with a trained run."""

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
    help="A run directory, or a model name trained earlier with `edgecap train`/`quickstart`.",
)
@beam_option
@click.option(
    "--backbone-weights",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Local backbone weights, when the run's features were made with a weights file.",
)
@click.option("--json", "as_json", is_flag=True, help="Print {image: caption} as JSON.")
@device_option
def caption(
    images: tuple[Path, ...], model: str, beam: int, backbone_weights: Path | None, as_json: bool, device: str
) -> None:
    """Caption IMAGES with a trained model."""
    import json

    from edgecap.captioner import Captioner
    from edgecap.training.loop import resolve_device

    try:
        captioner = Captioner.from_run(
            model, device=str(resolve_device(device)), beam=beam, backbone_weights=backbone_weights
        )
        captions = captioner.batch([str(p) for p in images])
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps({str(p): c for p, c in zip(images, captions, strict=True)}, indent=2))
    else:
        for path, text in zip(images, captions, strict=True):
            click.echo(f"{path}: {text}")
