"""``edgecap train scst RUN`` and ``edgecap train qat RUN``: the trainers that start from a trained run.

The model, vocabulary, data and cross-entropy recipe are RUN's; these commands take only what the stage itself needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edgecap.cli.options import (
    FiniteFloat,
    apply_threads,
    check_apart,
    check_out,
    device_option,
    fail,
    threads_option,
)
from edgecap.workshop.training.config import SCST_RECIPES

SCST_RECIPE_HELP = (
    "SCST recipe: v2 = ExpansionNet v2 (5 samples, RAdam 1e-4 x0.8/epoch), acort = ACORT (15 samples, Adam 5e-5, "
    "CIDEr-D + BLEU-4), or a JSON file of scst_* keys over a base recipe (docs/training.md)."
)


RECIPE_METAVAR = "|".join([*SCST_RECIPES, "FILE"])


class ScstRecipe(click.ParamType):
    """A named SCST recipe or a recipe file, read by the Python API's loader
    (:func:`edgecap.workshop.training.config.load_scst_recipe`) when the command line is parsed, so a bad recipe is
    a usage error before any work. The value is the recipe's TrainCfg fields."""

    name = "recipe"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> dict[str, Any]:
        from edgecap.workshop.training.config import ScstRecipeError, load_scst_recipe

        if isinstance(value, dict):
            return value
        try:
            return load_scst_recipe(value)
        except ScstRecipeError as exc:
            self.fail(str(exc), param, ctx)


def _trained_run(ctx: click.Context, param: click.Parameter, value: str) -> Path:
    """RUN as ``eval`` and ``prune`` take it: a run directory or a model name trained earlier (its default run)."""
    from edgecap.workshop.run_layout import RunError, resolve_run

    try:
        return resolve_run(value)
    except RunError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


_RUN = click.argument("run", callback=_trained_run)
_BATCH = click.option("--batch-size", type=click.IntRange(1), default=None, help="Images per batch [default: RUN's].")
_SEED = click.option("--seed", type=int, default=0, show_default=True)


@click.command("scst", short_help="Self-critical training (SCST) of a trained RUN, in place or into a copy.")
@_RUN
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="A new run, a copy of RUN trained further [default: RUN itself, continued in place].",
)
@click.option("--epochs", type=click.IntRange(1), required=True, help="Self-critical epochs (CIDEr-D reward).")
@click.option(
    "--recipe", type=ScstRecipe(), metavar=RECIPE_METAVAR, default="v2", show_default=True, help=SCST_RECIPE_HELP
)
@_BATCH
@_SEED
@device_option
@click.option("--max-steps", type=click.IntRange(0), default=0, help="Stop after this many steps (0 = no limit).")
@click.option("--max-minutes", type=FiniteFloat(0), default=0.0, help="Stop cleanly after this many minutes.")
@click.option("--features", type=click.Path(path_type=Path), default=None, help="Feature cache [default: RUN's].")
@click.option("--no-resume", is_flag=True, help="Start SCST afresh even if the run has an SCST checkpoint.")
@threads_option
def scst(
    run: Path,
    out: Path | None,
    epochs: int,
    recipe: dict[str, Any],
    batch_size: int | None,
    seed: int,
    device: str,
    max_steps: int,
    max_minutes: float,
    features: Path | None,
    no_resume: bool,
    threads: int,
) -> None:
    """Self-critical sequence training (SCST) of the trained RUN (a run directory or a trained model name), with
    its model, data and features: into --out (a copy) or into RUN itself. Under torchrun, data-parallel over the
    launched processes."""
    from edgecap.workshop.training import checkpoint as ckpt
    from edgecap.workshop.training.config import TrainCfg
    from edgecap.workshop.training.scst_loop import init_from_run, train_scst

    if out is not None:
        check_apart(out, run, f"the trained run {run} (leave --out out to continue it in place)")
    check_out(out or run)
    try:
        stored = TrainCfg.from_dict(ckpt.read_config(run)["train"])
    except (ValueError, KeyError) as exc:
        fail(f"cannot start from {run}: {exc}")
    apply_threads(threads)
    run_dir = init_from_run(run, out or run)
    cfg = stored.replace(
        out=str(run_dir),
        features=str(features) if features else stored.features,
        scst_epochs=epochs,
        scst_max_steps=max_steps,
        batch_size=batch_size or stored.batch_size,
        seed=seed,
        device=device,
        max_minutes=max_minutes,
        **recipe,
    )
    try:
        train_scst(cfg, run_dir, resume=not no_resume)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        fail(str(exc))
    click.echo(f"run written to {run_dir}")


@click.command("qat", short_help="Quantisation-aware fine-tuning of a trained RUN into a new run.")
@_RUN
@click.option("--out", type=click.Path(path_type=Path), required=True, help="The new run (RUN stays the FP32 parent).")
@click.option("--epochs", type=click.IntRange(1), required=True, help="Quantisation-aware fine-tuning epochs.")
@click.option(
    "--target",
    default="cpu-auto",
    show_default=True,
    help="The INT8 preset QAT simulates (as `edgecap export --target`); export the QAT run with the same target.",
)
@click.option("--lr", type=FiniteFloat(0, min_open=True), default=3e-5, show_default=True)
@click.option("--max-steps", type=click.IntRange(0), default=0, help="Stop after this many steps (0 = no limit).")
@_BATCH
@_SEED
@device_option
@threads_option
def qat(
    run: Path,
    out: Path,
    epochs: int,
    target: str,
    lr: float,
    max_steps: int,
    batch_size: int | None,
    seed: int,
    device: str,
    threads: int,
) -> None:
    """Quantisation-aware fine-tuning of the trained RUN (a run directory or a trained model name) into the new run
    --out, under the fake quantisation of --target (end to end from images, backbone included, for a run on backbone
    features). RUN, the FP32 parent the export compares against, is left as it is."""
    from edgecap.workshop.compression.qat import QatError, qat_run
    from edgecap.workshop.export.calibration.presets import get_preset

    try:
        get_preset(target)
    except ValueError as exc:
        fail(str(exc))
    check_apart(out, run, f"the trained run {run} (QAT's FP32 parent)")
    check_out(out, existing="refuse", atomic=True)
    apply_threads(threads)
    try:
        run_dir = qat_run(
            run,
            out,
            epochs=epochs,
            target=target,
            lr=lr,
            batch_size=batch_size or 0,
            max_steps=max_steps,
            device=device,
            seed=seed,
        )
    except (QatError, ValueError, FileNotFoundError, KeyError) as exc:
        fail(str(exc))
    click.echo(f"QAT run written to {run_dir}; export it with `edgecap export --model {run_dir} --int8 "
               f"--target {target} --calib DATA`")  # fmt: skip
