"""The SCST stage: sample K captions per image, reward them, one teacher-forced pass with gradient, repeat.

Runs after the cross-entropy epochs of :func:`edgecap.workshop.training.loop.train` (``--scst-epochs N``) or on a copy
of a trained run (``edgecap train scst RUN --epochs N``). Per batch of images:

1. **Sample** (no gradient): the shared sampling search (:func:`edgecap.runtime.decoding.sampling.sample`) draws K
captions
   per image through the model's cached ``step``, at temperature 1 with no top-k (ExpansionNet v2 §4.3, ACORT
   §5.1), up to ``scst_max_words`` words; a caption ends at its EOS. With the greedy baseline the greedy caption is
   decoded too.
2. **Reward**: CIDEr-D (+ optional BLEU-4) of every caption against its image's references, with document
   frequencies from the training split (:mod:`edgecap.workshop.training.rewards`); the baseline gives the advantages
   (:mod:`edgecap.workshop.training.scst`).
3. **Learn**: one teacher-forced ``decode_full`` over ``BOS + sample`` with gradient gives the log-probability of
   every sampled token and of EOS (when the sample ended with one); no autograd through a re-run prefix.

Families: every autoregressive model (one with ``start``/``step``: ACORT/ORT, ExpansionNet and their ``*-len``
variants). A non-autoregressive model (LaBERT, mask-predict) is refused: it has no left-to-right policy to sample.

Length-aware (``*-len``) models keep each image's **target level**: for every image one of its reference captions
is drawn (seeded by step) and its length level conditions all K samples and the teacher-forced pass, as in
cross-entropy training (LaBERT §3.1). The reward compares the samples with all references of the image.

End to end: a run that fine-tuned its backbone (``--finetune-epochs``, ExpansionNet v2 §4.3) has no feature cache
matching that backbone any more, so its SCST runs from images, fine-tuning backbone and captioner together (v2's
optional last step: 1 epoch at lr 2e-6): per batch the backbone computes the features once with gradient; the
sampler sees them detached and the teacher-forced pass back-propagates into the backbone (BatchNorm statistics
frozen, as in the cross-entropy fine-tuning). The best backbone is written to ``backbone.safetensors`` (the one SCST
started from is kept as ``backbone.xe.safetensors``) and ``config.json`` names it. End-to-end SCST runs in one
process.

Sampling runs the model in eval mode (no dropout); the teacher-forced pass runs in train mode, as the cross-entropy
stage does. The run directory gains ``weights.xe.safetensors`` (the cross-entropy weights SCST started from),
``checkpoints/scst/`` (resumable state), ``scst.json`` (summary) and ``"event": "scst"`` / ``"scst_val"`` lines in
``metrics.jsonl``; ``weights.safetensors`` holds the best weights by validation CIDEr-D, the starting weights
included (validated before the first SCST step).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from edgecap.runtime._io import atomic_path, atomic_write_json
from edgecap.workshop._progress import ProgressBar
from edgecap.workshop.training import checkpoint as ckpt
from edgecap.workshop.training.batches import VisualBatch
from edgecap.workshop.training.config import TrainCfg
from edgecap.workshop.training.distributed import Dist, epoch_order, init_distributed, shutdown, wrap_ddp
from edgecap.workshop.training.rewards import CaptionReward
from edgecap.workshop.training.scst import BASELINES, LOSS_NORMS
from edgecap.workshop.training.scst_files import (
    SCST_STATE,
    SCST_SUMMARY,
    XE_WEIGHTS,
    _open_backbone,
    _save_backbone,
    init_from_run,
)
from edgecap.workshop.training.scst_files import XE_BACKBONE as XE_BACKBONE  # re-exported: callers import it from here
from edgecap.workshop.training.scst_rollout import Rollout as Rollout  # re-exported: callers import it from here
from edgecap.workshop.training.scst_rollout import batch_seed, rollout, scst_objective, target_levels

__all__ = ["SCST_STATE", "SCST_SUMMARY", "XE_WEIGHTS", "init_from_run", "supports_scst", "train_scst"]


def supports_scst(model: Any) -> bool:
    """Whether ``model`` can be trained with SCST: an autoregressive family with the cached ``start``/``step``."""
    return callable(getattr(model, "start", None)) and callable(getattr(model, "step", None))


def check_scst_cfg(cfg: TrainCfg) -> None:
    """Clear errors for SCST settings that cannot work."""
    if cfg.scst_baseline not in BASELINES:
        raise ValueError(f"unknown SCST baseline {cfg.scst_baseline!r}; choose one of {BASELINES}")
    if cfg.scst_loss_norm not in LOSS_NORMS:
        raise ValueError(f"unknown SCST loss normalisation {cfg.scst_loss_norm!r}; choose one of {LOSS_NORMS}")
    if cfg.scst_optimizer not in ("radam", "adam"):
        raise ValueError(f"unknown SCST optimizer {cfg.scst_optimizer!r}; choose radam or adam")
    if cfg.scst_samples < 1 or (cfg.scst_baseline == "loo" and cfg.scst_samples < 2):
        raise ValueError(f"the {cfg.scst_baseline} baseline needs more samples per image, got {cfg.scst_samples}")
    if not cfg.scst_lr > 0 or not 0 < cfg.scst_anneal <= 1 or cfg.scst_max_words < 1:
        raise ValueError("scst_lr must be > 0, scst_anneal in (0, 1] and scst_max_words >= 1")


@dataclasses.dataclass
class _Progress:
    epoch: int = 0
    batch_in_epoch: int = 0
    step: int = 0
    best_score: float = -math.inf
    best_epoch: int = -1
    start_score: float | None = None


def _optimizer(
    model: torch.nn.Module, cfg: TrainCfg, batches_per_epoch: int, backbone: Any = None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    params = [p for p in model.parameters() if p.requires_grad]
    if backbone is not None:
        params += list(backbone.parameters())
    opt: torch.optim.Optimizer
    if cfg.scst_optimizer == "radam":
        opt = torch.optim.RAdam(params, lr=cfg.scst_lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    else:
        opt = torch.optim.Adam(params, lr=cfg.scst_lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=cfg.weight_decay)
    anneal, per_epoch = cfg.scst_anneal, max(batches_per_epoch, 1)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda it: anneal ** (it // per_epoch))


def train_scst(
    cfg: TrainCfg,
    run_dir: str | Path | None = None,
    *,
    resume: bool = True,
    progress: bool = True,
    ctx: Dist | None = None,
    device: torch.device | None = None,
) -> Path:
    """Run ``cfg.scst_epochs`` epochs of SCST on the run in ``run_dir`` (default ``cfg.out``); resumable.

    Args:
        cfg: the training cfg (``scst_*`` fields, ``data``, ``features``, ``batch_size``, ``seed``, ...).
        run_dir: a run with ``config.json``, ``vocab.json`` and ``weights.safetensors`` (the starting weights).
        resume: continue from ``checkpoints/scst`` when it exists.
        ctx, device: the process group and device when called from a running training job; otherwise joined
            here from the torchrun environment.

    Returns:
        The run directory.

    Raises:
        ValueError: the model is not autoregressive, or the SCST settings are invalid.
    """
    from edgecap.runtime.vocab import load_vocab
    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.data.sources import open_feature_source
    from edgecap.workshop.evaluation.cider import cider_d
    from edgecap.workshop.models import cfg_from_dict, create_model_from_cfg
    from edgecap.workshop.torch_runtime.captioning import caption_bank
    from edgecap.workshop.torch_runtime.runtime import resolve_device
    from edgecap.workshop.training.batches import FeatureBank

    check_scst_cfg(cfg)
    run_dir = Path(run_dir or cfg.out)
    owns_group = ctx is None
    if ctx is None or device is None:
        ctx, device = init_distributed(resolve_device(cfg.device))
    config = ckpt.read_config(run_dir)
    vocab = load_vocab(run_dir / ckpt.VOCAB)
    model = create_model_from_cfg(cfg_from_dict(config["model"]["cfg"]), vocab.size)
    if not supports_scst(model):
        raise ValueError(
            f"{config['model']['name']} is not autoregressive (no cached start/step to sample from), so it cannot be "
            "trained with self-critical sequence training; SCST applies to ACORT/ORT and ExpansionNet models"
        )
    end_to_end = bool(config.get("backbone_before_end_to_end"))
    if end_to_end and ctx.active:
        raise ValueError("end-to-end SCST (a run that fine-tuned its backbone) runs in one process, not under torchrun")

    state = ckpt.load_training_state(run_dir, model, where=SCST_STATE) if resume else None
    if state is None:
        start = run_dir / (XE_WEIGHTS if (run_dir / XE_WEIGHTS).is_file() else ckpt.WEIGHTS)
        ckpt.load_weights(model, start)
        if ctx.is_main and not (run_dir / XE_WEIGHTS).is_file():
            with atomic_path(run_dir / XE_WEIGHTS) as tmp:
                shutil.copyfile(run_dir / ckpt.WEIGHTS, tmp)
    model.to(device)
    backbone = _open_backbone(run_dir, config, state, ctx) if end_to_end else None
    if backbone is not None:
        backbone.to(device).eval()  # BatchNorm statistics frozen; gradients still reach every backbone weight
    torch.manual_seed(cfg.seed * 7 + 1 + ctx.rank)  # dropout of the teacher-forced pass
    if ctx.is_main:
        config["train"] = cfg.to_dict()
        ckpt.write_config(run_dir, config)

    dataset = load_dataset(cfg.data)
    train_records = dataset.split("train")
    val_records = dataset.split("val")[: cfg.val_images or None]
    if not train_records:
        raise ValueError(f"{cfg.data} has no training images")
    if backbone is None:
        source = open_feature_source(cfg.features)
        train_bank = FeatureBank(source, [r.image_id for r in train_records])
        val_bank = FeatureBank(source, [r.image_id for r in val_records]) if (val_records and ctx.is_main) else None
    else:
        from edgecap.workshop.training.end_to_end import _check_images

        _check_images(train_records + val_records)
        train_bank, val_bank = None, None
    val_refs = {r.image_id: [" ".join(c) for c in r.captions] for r in val_records}
    reward = CaptionReward(
        [r.captions for r in train_records], bleu_weight=cfg.scst_bleu_weight, eos_word=cfg.scst_eos_word
    )
    train_refs = [reward.references(r.captions) for r in train_records]
    batch_size = cfg.scst_batch_size or cfg.batch_size
    local_images = len(epoch_order(len(train_records), cfg.seed, 0, ctx))
    batches_per_epoch = math.ceil(local_images / batch_size)
    optimizer, scheduler = _optimizer(model, cfg, batches_per_epoch, backbone)
    call = wrap_ddp(model, ctx)
    prog = _Progress()
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
        if ctx.rank:
            torch.manual_seed(batch_seed(cfg.seed, state["progress"]["epoch"], state["progress"]["step"], ctx.rank))
        prog = _Progress(**state["progress"])
    started = time.monotonic()

    def save_state() -> None:
        if ctx.is_main:
            snapshot = {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": ckpt.rng_state(),
                "progress": dataclasses.asdict(prog),
            }
            if backbone is not None:
                snapshot["backbone"] = {k: v.detach().cpu() for k, v in backbone.model.state_dict().items()}
            ckpt.save_training_state(run_dir, model, snapshot, where=SCST_STATE)

    def train_visual(rows: list[int]) -> VisualBatch:
        if backbone is None:
            return cast(FeatureBank, train_bank).batch(rows).to(device)  # features in: the bank is built
        features, boxes = backbone(backbone.preprocess([train_records[r].path for r in rows]).to(device))
        return VisualBatch(features, boxes, torch.ones(features.shape[:2], dtype=torch.bool, device=device))

    def validate(epoch: int, partial: bool = False) -> None:
        bank = val_bank
        if backbone is not None and val_records:
            from edgecap.workshop.training.end_to_end import _ImageFeatures

            bank = FeatureBank(_ImageFeatures(backbone, val_records), [r.image_id for r in val_records])
        if bank is not None:
            model.eval()
            preds = caption_bank(model, bank, vocab, beam_size=cfg.val_beam, max_words=cfg.max_words, device=device)
            model.train()
            score = cider_d({i: p for i, p in zip(bank.image_ids, preds, strict=True)}, val_refs)
            record = {"event": "scst_val", "epoch": epoch, "step": prog.step, "cider_d": score, "example": preds[0]}
            if partial:
                record["partial_epoch"] = True
            ckpt.append_metrics(run_dir, {**record, "elapsed_s": round(time.monotonic() - started, 2)})
            if progress:
                when = "start" if epoch < 0 else f"epoch {epoch + 1}" + (" (stopped mid-epoch)" if partial else "")
                print(f"SCST {when}: val CIDEr-D {score * 100:.1f}  e.g. {preds[0]!r}")
            if prog.start_score is None:
                prog.start_score = score
            if score > prog.best_score:
                prog.best_score, prog.best_epoch = score, epoch
                if epoch >= 0:  # epoch -1 is the starting model, whose weights are already in place
                    ckpt.save_weights(model, run_dir / ckpt.WEIGHTS)
                    if backbone is not None:
                        _save_backbone(run_dir, backbone)

    model.train()
    if prog.step == 0 and prog.batch_in_epoch == 0 and prog.epoch == 0 and prog.start_score is None:
        if ctx.is_main:
            validate(-1)
        save_state()
        ctx.barrier()

    stopped = False
    while prog.epoch < cfg.scst_epochs and not stopped:
        order = epoch_order(len(train_records), cfg.seed, prog.epoch, ctx)
        bar = ProgressBar(
            batches_per_epoch,
            f"SCST {prog.epoch + 1}/{cfg.scst_epochs}",
            enabled=progress and ctx.is_main,
            initial=prog.batch_in_epoch,
        )
        running: list[float] = []
        for b in range(prog.batch_in_epoch, batches_per_epoch):
            rows = order[b * batch_size : (b + 1) * batch_size]
            seed = batch_seed(cfg.seed, prog.epoch, b, ctx.rank)
            levels = target_levels(model, [train_records[r].captions for r in rows], seed)
            visual = train_visual(rows)
            seen = VisualBatch(visual.features.detach(), visual.boxes.detach(), visual.mask)  # the sampler's copy
            roll = rollout(model, seen, [train_refs[r] for r in rows], vocab, cfg, reward, seed, levels)
            loss = call(scst_objective, visual, roll, cfg.scst_samples, cfg.scst_loss_norm, levels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], cfg.grad_clip)
            optimizer.step()
            scheduler.step()
            prog.step += 1
            prog.batch_in_epoch = b + 1
            mean_reward = ctx.mean(float(roll.rewards.mean()))
            running.append(mean_reward)
            bar.update(1)
            bar.postfix(reward=f"{np.mean(running[-50:]):.3f}", lr=f"{scheduler.get_last_lr()[0]:.1e}")
            if ctx.is_main and (prog.step % 20 == 0 or prog.step == 1 or b == batches_per_epoch - 1):
                ckpt.append_metrics(
                    run_dir,
                    {
                        "event": "scst",
                        "epoch": prog.epoch,
                        "step": prog.step,
                        "loss": float(loss.detach()),
                        "reward": mean_reward,
                        "lr": scheduler.get_last_lr()[0],
                        "elapsed_s": round(time.monotonic() - started, 2),
                        "example": roll.captions[0],
                    },
                )
            if cfg.save_every_steps and prog.step % cfg.save_every_steps == 0:
                save_state()
            if cfg.scst_max_steps and prog.step >= cfg.scst_max_steps:
                stopped = True
                break
            over_time = bool(cfg.max_minutes) and (time.monotonic() - started) / 60 >= cfg.max_minutes
            if cfg.max_minutes and ctx.agree(over_time):  # rank 0 decides, so every rank stops at the same step
                stopped = True
                break
        bar.close()
        if prog.batch_in_epoch >= batches_per_epoch:
            finished = prog.epoch
            prog.epoch += 1
            prog.batch_in_epoch = 0
            if ctx.is_main:
                validate(finished)
        elif ctx.is_main and prog.batch_in_epoch:  # stopped by the step or time limit: the weights so far compete too
            validate(prog.epoch, partial=True)
        save_state()
        ctx.barrier()

    if ctx.is_main:
        if not val_records:  # nothing to select by: keep the latest weights
            ckpt.save_weights(model, run_dir / ckpt.WEIGHTS)
            if backbone is not None:
                _save_backbone(run_dir, backbone)
        summary: dict[str, Any] = {
            "epochs_done": prog.epoch,
            "steps": prog.step,
            "start_val_cider_d": prog.start_score,
            "best_val_cider_d": None if prog.best_score == -math.inf else prog.best_score,
            "best_epoch": prog.best_epoch,
            "processes": ctx.world,
            "global_batch_images": batch_size * ctx.world,
            "train_seconds_this_session": round(time.monotonic() - started, 1),
        }
        atomic_write_json(run_dir / SCST_SUMMARY, summary)
    if owns_group:
        shutdown(ctx)
    return run_dir
