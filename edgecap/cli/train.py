"""``edgecap train``: cross-entropy training on cached features, then optionally self-critical training (SCST).

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
from edgecap.runtime.decoding.config import MAX_BEAM
from edgecap.workshop.training.config import SCST_RECIPES, TrainCfg

_DEFAULTS = TrainCfg()
_QAT_OPTIONS = ("qat_epochs", "qat_target", "qat_lr", "qat_max_steps")
_SCST_OPTIONS = (
    "scst_lr",
    "scst_anneal",
    "scst_optimizer",
    "scst_batch_size",
    "scst_samples",
    "scst_baseline",
    "scst_max_words",
    "scst_bleu_weight",
    "scst_loss_norm",
    "scst_eos_word",
)


def default_features_dir(data: Path) -> Path:
    from edgecap.cli.features import default_cache_dir

    return default_cache_dir(data, "tf_efficientnet_lite0", 224)


@click.command("train")
@click.option("--model", "model_name", default="acort-xsmall", show_default=True, help="Registered model name.")
@click.option(
    "--data",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Dataset directory (Karpathy dataset.json + images) or a dataset JSON file [required unless --init].",
)
@click.option(
    "--init",
    "init_run",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Start from this trained run (its model, vocabulary, best weights, data and features) and run only SCST "
    "(--scst-epochs), into --out (a copy) or into the run itself when --out is not given.",
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
    "--scst-recipe",
    type=click.Choice(sorted(SCST_RECIPES)),
    default="v2",
    show_default=True,
    help="Paper recipe for the SCST options below: v2 = ExpansionNet v2 (5 samples, RAdam 1e-4 x0.8/epoch), "
    "acort = ACORT (15 samples, Adam 5e-5, CIDEr-D + BLEU-4).",
)
@click.option("--scst-lr", type=FiniteFloat(0, min_open=True), default=None, help="SCST learning rate [recipe].")
@click.option("--scst-anneal", type=FiniteFloat(0, 1, min_open=True), default=None, help="lr factor per epoch.")
@click.option("--scst-optimizer", type=click.Choice(["radam", "adam"]), default=None)
@click.option("--scst-batch-size", type=click.IntRange(1), default=None, help="Images per SCST batch [--batch-size].")
@click.option("--scst-samples", type=click.IntRange(1), default=None, help="Captions sampled per image (K) [recipe].")
@click.option("--scst-baseline", type=click.Choice(["loo", "greedy"]), default=None, help="Leave-one-out or greedy.")
@click.option("--scst-max-words", type=click.IntRange(1), default=None, help="Longest sampled caption [recipe].")
@click.option("--scst-bleu-weight", type=FiniteFloat(0), default=None, help="BLEU-4 weight in the reward.")
@click.option("--scst-loss-norm", type=click.Choice(["sequence", "token"]), default=None)
@click.option("--scst-eos-word/--no-scst-eos-word", default=None, help="Score EOS as a word in the reward.")
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
@click.option(
    "--qat-epochs",
    type=click.IntRange(0),
    default=0,
    help="With --init RUN: quantisation-aware fine-tuning for N epochs into a new --out run, under the fake "
    "quantisation of --qat-target (end to end from images, backbone included, for a run on backbone features).",
)
@click.option(
    "--qat-target",
    default="cpu-auto",
    show_default=True,
    help="The INT8 preset QAT simulates (as `edgecap export --target`); export the QAT run with the same target.",
)
@click.option("--qat-lr", type=FiniteFloat(0, min_open=True), default=3e-5, show_default=True)
@click.option("--qat-max-steps", type=click.IntRange(0), default=0, help="Stop QAT after this many steps.")
@click.option("--no-resume", is_flag=True, help="Start afresh even if the run directory has a checkpoint.")
@device_option
@threads_option
def train(
    model_name: str,
    data: Path | None,
    init_run: Path | None,
    features: Path | None,
    out: Path | None,
    no_resume: bool,
    overrides: tuple[str, ...],
    threads: int,
    scst_recipe: str,
    **options: Any,
) -> None:
    """Train MODEL on a captioning dataset with cross-entropy, then optionally SCST; resumable, best checkpoint kept
    by val CIDEr-D. Under torchrun, data-parallel over the launched processes."""
    apply_threads(threads)
    from edgecap.workshop.models import list_models
    from edgecap.workshop.run_layout import default_run_dir
    from edgecap.workshop.training.config import TrainCfg
    from edgecap.workshop.training.loop import train as run_training

    scst = {name: options.pop(name) for name in _SCST_OPTIONS}
    scst = {**SCST_RECIPES[scst_recipe], **{k: v for k, v in scst.items() if v is not None}}
    qat = {name: options.pop(name) for name in _QAT_OPTIONS}
    if init_run is not None:
        _refuse_options_init_ignores()
        if qat["qat_epochs"]:
            _qat_from_run(init_run, out, options, qat)
            return
        _train_from_run(init_run, out, features, no_resume, options, scst)
        return
    if qat["qat_epochs"]:
        fail("--qat-epochs fine-tunes a trained run: pass --init RUN and --out NEW_RUN")
    if data is None:
        fail("pass --data (the dataset to train on), or --init RUN to run SCST from a trained run")
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
        **scst,
    )
    try:
        run_dir = run_training(cfg, resume=not no_resume)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        fail(str(exc))
    click.echo(f"run written to {run_dir}")


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


#: What ``--init RUN`` takes from the command line; every other option comes from RUN's stored recipe.
_INIT_OPTIONS = frozenset(
    {"init_run", "features", "out", "no_resume", "threads", "scst_recipe", "scst_epochs", "scst_max_steps",
     "batch_size", "seed", "device", "val_beam", "max_minutes", *_SCST_OPTIONS, *_QAT_OPTIONS}
)  # fmt: skip


def _refuse_options_init_ignores() -> None:
    """``--init RUN`` with an option it would ignore (``--model``, ``--data``, ``--lr``, ``--set`` …) is an error, not
    a silent no-op: the model, data and cross-entropy recipe are RUN's."""
    ctx = click.get_current_context()
    given = [
        param.opts[0]
        for param in ctx.command.params
        if param.name not in _INIT_OPTIONS
        and ctx.get_parameter_source(param.name) not in (None, ParameterSource.DEFAULT)
    ]
    if given:
        fail(f"--init RUN takes the model, data and recipe from RUN; drop {', '.join(sorted(given))}")


def _train_from_run(
    init_run: Path, out: Path | None, features: Path | None, no_resume: bool, options: dict, scst: dict
) -> None:
    """``--init RUN``: SCST on a copy of a trained run (or the run itself), with its model, data and features.

    The stored cross-entropy recipe is kept; the SCST options, the batch size, seed, device and step limits come
    from this command line.
    """
    from edgecap.workshop.training import checkpoint as ckpt
    from edgecap.workshop.training.scst_loop import init_from_run, train_scst

    if not options.get("scst_epochs"):
        fail("--init RUN runs self-critical training only: pass --scst-epochs N")
    if out is not None:
        check_apart(out, init_run, f"the --init run {init_run} (leave --out out to continue it in place)")
    check_out(out or init_run)
    try:
        stored = TrainCfg.from_dict(ckpt.read_config(init_run)["train"])
    except (ValueError, KeyError) as exc:
        fail(f"cannot start from {init_run}: {exc}")
    run_dir = init_from_run(init_run, out or init_run)
    keep = ("scst_epochs", "scst_max_steps", "batch_size", "seed", "device", "val_beam", "max_minutes")
    cfg = stored.replace(
        out=str(run_dir),
        features=str(features) if features else stored.features,
        **{k: options[k] for k in keep if k in options},
        **scst,
    )
    try:
        train_scst(cfg, run_dir, resume=not no_resume)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        fail(str(exc))
    click.echo(f"run written to {run_dir}")


def _qat_from_run(init_run: Path, out: Path | None, options: dict, qat: dict) -> None:
    """``--init RUN --qat-epochs N``: quantisation-aware fine-tuning of RUN into the new run ``--out``
    (``edgecap.workshop.compression.qat``); RUN, the FP32 parent the export compares against, is left as it is."""
    from edgecap.workshop.compression.qat import QatError, qat_run
    from edgecap.workshop.export.calibration.presets import get_preset

    if out is None:
        fail("--qat-epochs writes a new run: pass --out NEW_RUN (RUN stays the FP32 parent)")
    if options.get("scst_epochs"):
        fail("run SCST and QAT one after the other: QAT last (`--init SCST_RUN --qat-epochs N`), so the weights "
             "that get quantised are the final ones")  # fmt: skip
    try:
        get_preset(qat["qat_target"])
    except ValueError as exc:
        fail(str(exc))
    check_apart(out, init_run, f"the --init run {init_run} (QAT's FP32 parent)")
    check_out(out, existing="refuse", atomic=True)
    try:
        run_dir = qat_run(
            init_run,
            out,
            epochs=qat["qat_epochs"],
            target=qat["qat_target"],
            lr=qat["qat_lr"],
            batch_size=options.get("batch_size") or 0,
            max_steps=qat["qat_max_steps"],
            device=options.get("device") or "cpu",
            seed=options.get("seed") or 0,
        )
    except (QatError, ValueError, FileNotFoundError, KeyError) as exc:
        fail(str(exc))
    click.echo(f"QAT run written to {run_dir}; export it with `edgecap export --model {run_dir} --int8 "
               f"--target {qat['qat_target']} --calib DATA`")  # fmt: skip
