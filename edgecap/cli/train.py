"""``edgecap train``: cross-entropy training on cached features."""

from __future__ import annotations

from pathlib import Path

import click

from edgecap.cli.options import apply_threads, device_option, fail, parse_overrides, threads_option
from edgecap.training.config import TrainCfg

_DEFAULTS = TrainCfg()


def default_features_dir(data: Path) -> Path:
    from edgecap.cli.features import default_cache_dir

    return default_cache_dir(data, "tf_efficientnet_lite0", 224)


@click.command("train")
@click.option("--model", "model_name", default="acort-xsmall", show_default=True, help="Registered model name.")
@click.option(
    "--data",
    type=click.Path(exists=True, path_type=Path),
    required=True,
    help="Dataset directory (Karpathy dataset.json + images) or a dataset JSON file.",
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
@click.option("--lr", type=float, default=_DEFAULTS.lr, show_default=True, help="Peak learning rate.")
@click.option("--warmup", "warmup_steps", type=click.IntRange(0), default=_DEFAULTS.warmup_steps, show_default=True)
@click.option("--label-smoothing", type=click.FloatRange(0, 1), default=_DEFAULTS.label_smoothing, show_default=True)
@click.option("--grad-clip", type=click.FloatRange(0), default=_DEFAULTS.grad_clip, show_default=True)
@click.option("--max-words", type=click.IntRange(1), default=_DEFAULTS.max_words, show_default=True)
@click.option("--max-minutes", type=click.FloatRange(0), default=0.0, help="Stop cleanly after this many minutes.")
@click.option("--max-steps", type=click.IntRange(0), default=0, help="Stop after this many optimiser steps.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--finetune-epochs",
    type=click.IntRange(0),
    default=0,
    help="After the frozen-backbone epochs, fine-tune backbone + captioner end to end from images for this many "
    "epochs (ExpansionNet v2 §4.3; RAdam). 0 = off.",
)
@click.option("--finetune-lr", type=float, default=_DEFAULTS.finetune_lr, show_default=True)
@click.option(
    "--backbone-weights",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="The feature cache's backbone weights file, when it came from a local file (needed for --finetune-epochs).",
)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a model config field.")
@click.option("--no-resume", is_flag=True, help="Start afresh even if the run directory has a checkpoint.")
@device_option
@threads_option
def train(
    model_name: str,
    data: Path,
    features: Path | None,
    out: Path | None,
    no_resume: bool,
    overrides: tuple,
    threads: int,
    **options,
) -> None:
    """Train MODEL on a captioning dataset with cross-entropy; resumable, best checkpoint kept by val CIDEr-D."""
    apply_threads(threads)
    from edgecap.models import list_models
    from edgecap.runs import default_run_dir
    from edgecap.training.config import TrainCfg
    from edgecap.training.loop import train as run_training

    if model_name not in list_models():
        fail(f"unknown model {model_name!r}; `edgecap zoo` lists the registered ones")
    features = features or default_features_dir(data)
    if not features.exists():
        fail(f"no features at {features}: run `edgecap features --data {data}` first, or pass --features")
    out = out or default_run_dir(model_name)
    options["backbone_weights"] = options["backbone_weights"] or ""
    cfg = TrainCfg(
        model=model_name,
        data=str(data),
        features=str(features),
        out=str(out),
        model_overrides=parse_overrides(overrides),
        **options,
    )
    try:
        run_dir = run_training(cfg, resume=not no_resume)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        fail(str(exc))
    click.echo(f"run written to {run_dir}")
