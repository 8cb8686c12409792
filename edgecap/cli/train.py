"""``edgecap train``: a new captioner from data (cross-entropy, then optionally SCST, end-to-end fine-tuning,
distillation from a teacher); its subcommands ``scst`` and ``qat`` start from a trained run (``cli/train_run.py``).

Data-parallel under torchrun: ``torchrun --nproc-per-node N -m edgecap train ...`` (docs/training.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from edgecap.cli.options import (
    FiniteFloat,
    apply_threads,
    check_apart,
    check_out,
    device_option,
    fail,
    parse_overrides,
    threads_option,
)
from edgecap.cli.train_run import RECIPE_METAVAR, SCST_RECIPE_HELP, ScstRecipe, qat, scst
from edgecap.runtime.decoding.config import MAX_BEAM
from edgecap.workshop.training.config import TrainCfg

_DEFAULTS = TrainCfg()


class _TrainGroup(click.Group):
    """``train``'s options train a new model; a subcommand starts from a run. The removed ``--init RUN`` (and
    ``--qat-*``) spelling gets a pointer to the subcommands instead of click's bare "no such option"."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if any(a.split("=")[0] == "--init" or a.startswith("--qat-") for a in args[: (args + ["--"]).index("--")]):
            raise click.UsageError("`train --init RUN` is now `edgecap train scst RUN` or `edgecap train qat RUN`", ctx)
        return super().parse_args(ctx, args)


def default_features_dir(data: Path) -> Path:
    from edgecap.cli.features import default_cache_dir

    return default_cache_dir(data, "tf_efficientnet_lite0", 224)


@click.group("train", cls=_TrainGroup, invoke_without_command=True, subcommand_metavar="[scst|qat RUN ...]")
@click.option("--model", "model_name", default="acort-xsmall", show_default=True, help="Registered model name.")
@click.option(
    "--data",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Dataset directory (Karpathy dataset.json + images) or a dataset JSON file [required].",
)
@click.option(
    "--features",
    type=click.Path(path_type=Path),
    default=None,
    help="Feature cache or region-feature directory [default: the cache `edgecap features` made].",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Run directory [default: $EDGECAP_HOME/runs/MODEL, where `--model MODEL` elsewhere finds it].",
)
@click.option("--epochs", type=click.IntRange(1), default=_DEFAULTS.epochs, show_default=True)
@click.option(
    "--batch-size", type=click.IntRange(1), default=_DEFAULTS.batch_size, show_default=True, help="Images per batch."
)
@click.option(
    "--optimizer",
    type=click.Choice(["adam-noam", "radam", "adamw", "adamw-cosine"]),
    default=_DEFAULTS.optimizer,
    show_default=True,
)
@click.option(
    "--lr", type=FiniteFloat(0, min_open=True), default=_DEFAULTS.lr, show_default=True, help="Peak learning rate."
)
@click.option("--warmup", "warmup_steps", type=click.IntRange(0), default=_DEFAULTS.warmup_steps, show_default=True)
@click.option("--label-smoothing", type=FiniteFloat(0, 1), default=_DEFAULTS.label_smoothing, show_default=True)
@click.option("--grad-clip", type=FiniteFloat(0), default=_DEFAULTS.grad_clip, show_default=True)
@click.option("--max-words", type=click.IntRange(1), default=_DEFAULTS.max_words, show_default=True)
@click.option(
    "--max-minutes",
    type=FiniteFloat(0),
    default=0.0,
    help="Stop each stage of this session (cross-entropy, then SCST) cleanly after this many minutes.",
)
@click.option("--max-steps", type=click.IntRange(0), default=0, help="Stop after this many optimiser steps.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--finetune-epochs",
    type=click.IntRange(0),
    default=0,
    help="After the frozen-backbone epochs, fine-tune backbone + captioner end to end from images for this many "
    "epochs (ExpansionNet v2 §4.3; RAdam). 0 = off.",
)
@click.option("--finetune-lr", type=FiniteFloat(0, min_open=True), default=_DEFAULTS.finetune_lr, show_default=True)
@click.option(
    "--backbone-weights",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="The feature cache's backbone weights file, when it came from a local file (needed for --finetune-epochs).",
)
@click.option(
    "--scst-epochs",
    type=click.IntRange(0),
    default=0,
    help="Self-critical sequence training epochs after the cross-entropy ones (CIDEr-D reward). 0 = off.",
)
@click.option(
    "--scst-recipe", type=ScstRecipe(), metavar=RECIPE_METAVAR, default="v2", show_default=True, help=SCST_RECIPE_HELP
)
@click.option("--scst-max-steps", type=click.IntRange(0), default=0, help="Stop SCST after this many steps.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a model config field.")
@click.option(
    "--teacher",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Distil from this trained run (same feature cache): its token distributions (--kd-mode word, the "
    "student takes its vocabulary), its beam captions as extra targets (sequence) or both.",
)
@click.option("--kd-mode", type=click.Choice(["word", "sequence", "both"]), default="word", show_default=True)
@click.option("--kd-temperature", type=FiniteFloat(0, min_open=True), default=2.0, show_default=True)
@click.option("--kd-alpha", type=FiniteFloat(0, 1), default=0.5, show_default=True, help="Weight of the KD term.")
@click.option(
    "--kd-beam", type=click.IntRange(1, MAX_BEAM), default=3, show_default=True, help="Beam of the teacher's captions."
)
@click.option("--no-resume", is_flag=True, help="Start afresh even if the run directory has a checkpoint.")
@device_option
@threads_option
def train(
    model_name: str,
    data: Path | None,
    features: Path | None,
    out: Path | None,
    no_resume: bool,
    overrides: tuple[str, ...],
    threads: int,
    scst_recipe: dict[str, Any],
    **options: Any,
) -> None:
    """Train a captioner. Without a subcommand: a new MODEL from a captioning dataset with cross-entropy, then
    optionally SCST (--scst-epochs), end-to-end fine-tuning of the backbone (--finetune-epochs) and distillation
    from a teacher run (--teacher); resumable, best checkpoint kept by val CIDEr-D; under torchrun, data-parallel.
    From a trained run: `train scst RUN` (self-critical training) and `train qat RUN` (quantisation-aware)."""
    ctx = click.get_current_context()
    if ctx.invoked_subcommand is not None:
        _refuse_new_model_options(ctx)
        return
    apply_threads(threads)
    from edgecap.workshop.models import list_models
    from edgecap.workshop.run_layout import default_run_dir
    from edgecap.workshop.training.loop import train as run_training

    if data is None:
        fail("pass --data (the dataset to train on), or start from a trained run: `edgecap train scst|qat RUN`")
    if model_name not in list_models():
        fail(f"unknown model {model_name!r}; `edgecap zoo` lists the registered ones")
    features = features or default_features_dir(data)
    if not features.exists():
        fail(f"no features at {features}: run `edgecap features --data {data}` first, or pass --features")
    out = out or default_run_dir(model_name)
    if options["teacher"]:
        _check_teacher(Path(options["teacher"]), out)
    out = check_out(out)
    options["backbone_weights"] = options["backbone_weights"] or ""
    options["teacher"] = str(Path(options["teacher"]).resolve()) if options["teacher"] else ""
    cfg = TrainCfg(
        model=model_name,
        data=str(data),
        features=str(features),
        out=str(out),
        model_overrides=parse_overrides(overrides),
        **options,
        **scst_recipe,
    )
    try:
        run_dir = run_training(cfg, resume=not no_resume)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        fail(str(exc))
    click.echo(f"run written to {run_dir}")


train.add_command(scst)
train.add_command(qat)


def _refuse_new_model_options(ctx: click.Context) -> None:
    """``train --lr X scst RUN``: the options before the subcommand train a new model, so they would be ignored; an
    error, not a silent no-op (the subcommand takes its own after its name)."""
    given = [
        param.opts[0]
        for param in ctx.command.params
        if ctx.get_parameter_source(param.name or "") not in (None, ParameterSource.DEFAULT)
    ]
    if given:
        sub = ctx.invoked_subcommand
        fail(f"the options before `{sub}` train a new model, not RUN: drop {', '.join(sorted(given))} "
             f"(`edgecap train {sub} --help` lists its own)")  # fmt: skip


def _check_teacher(teacher: Path, out: Path) -> None:
    """What can be refused of ``--teacher RUN`` before ``--out`` exists: a teacher that is the new run (or nests
    with it), or that is not a training run at all (a bundle). The rest (its feature width, vocabulary and model
    family against the student's) is checked by the training loop before it creates ``--out``."""
    from edgecap.workshop.run_layout import RunError, read_run_config

    check_apart(out, teacher, f"the --teacher run {teacher}")
    try:
        read_run_config(teacher)
    except RunError as exc:
        fail(f"--teacher {teacher}: {exc}")
