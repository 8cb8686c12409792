"""``edgecap quickstart``: the whole pipeline on the built-in synthetic dataset, offline."""

from __future__ import annotations

from pathlib import Path

import click

from edgecap.cli.options import (
    FiniteFloat,
    apply_threads,
    beam_option,
    check_out,
    device_option,
    fail,
    parse_overrides,
    threads_option,
)


@click.command("quickstart")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the dataset and features go [default: $EDGECAP_HOME/quickstart].",
)
@click.option("--model", default="acort-xsmall", show_default=True)
@click.option("--images", type=click.IntRange(50, 1_000_000), default=2000, show_default=True)
@click.option("--epochs", type=click.IntRange(1), default=12, show_default=True, help="Training epochs.")
@click.option("--minutes", type=FiniteFloat(0), default=0.0, help="Optional training time cap (0 = none).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--out",
    "run_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Run directory [default: $EDGECAP_HOME/runs/MODEL].",
)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a model config field.")
@beam_option
@device_option
@threads_option
def quickstart(
    workdir: Path | None,
    model: str,
    images: int,
    minutes: float,
    epochs: int,
    seed: int,
    run_dir: Path | None,
    overrides: tuple,
    beam: int,
    device: str,
    threads: int,
) -> None:
    """Synthesise scenes, cache EfficientNet-Lite0 features, train MODEL, score it and caption a few images."""
    apply_threads(threads)
    from edgecap.cli.quickstart_pipeline import QuickstartCfg, run_quickstart
    from edgecap.runtime._home import edgecap_home
    from edgecap.workshop.run_layout import default_run_dir

    beam = _quickstart_beam(model, beam)
    workdir = check_out(workdir or edgecap_home() / "quickstart", "--workdir")
    check_out(run_dir or default_run_dir(model))  # before the dataset, the features and the training
    cfg = QuickstartCfg(
        workdir=workdir,
        model=model,
        images=images,
        seed=seed,
        minutes=minutes,
        epochs=epochs,
        beam=beam,
        run_dir=run_dir,
        device=device,
        overrides=parse_overrides(overrides),
    )
    try:
        run_quickstart(cfg)
    except (ValueError, FileNotFoundError, RuntimeError, ImportError) as exc:
        fail(str(exc))


def _quickstart_beam(model: str, beam: int) -> int:
    """The beam of a mask-predict model (LaBERT) is 1: an unset --beam becomes 1 (it refines one caption), a given
    one above 1 is refused now rather than after the training."""
    from click.core import ParameterSource

    from edgecap.runtime.captioner import NO_BEAM_SEARCH
    from edgecap.workshop.models import UnknownModelError, family_hooks, model_family

    try:
        decoding = family_hooks(model_family(model)).decoding
    except UnknownModelError:
        return beam  # the run reports the unknown model
    if decoding != "mask_predict":
        return beam
    if beam != 1 and click.get_current_context().get_parameter_source("beam") != ParameterSource.DEFAULT:
        fail(f"--beam {beam}: {NO_BEAM_SEARCH}")
    return 1
