"""Cross-entropy training: cached features in, a run directory with the best weights out."""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from edgecap._version import __version__
from edgecap.runtime._io import atomic_write_json
from edgecap.workshop._progress import ProgressBar
from edgecap.workshop.compression.distill import (
    DistillationError,
    kd_objective,
    load_checked_teacher,
    make_distiller,
)
from edgecap.workshop.torch_runtime.runtime import resolve_device
from edgecap.workshop.training import checkpoint as ckpt
from edgecap.workshop.training.batches import FeatureBank, VisualBatch, encode_captions, pick_captions
from edgecap.workshop.training.config import TrainCfg
from edgecap.workshop.training.determinism import make_deterministic
from edgecap.workshop.training.distributed import epoch_order, init_distributed, shutdown, wrap_ddp
from edgecap.workshop.training.objectives import objective_for
from edgecap.workshop.training.schedules import noam, warmup_constant, warmup_cosine


def seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_optimizer(
    model: torch.nn.Module, cfg: TrainCfg, d_model: int, total_steps: int = 0
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt: torch.optim.Optimizer
    if cfg.optimizer == "adam-noam":
        opt = torch.optim.Adam(params, lr=1.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=cfg.weight_decay)
        # `lr` is the Noam factor; scale it so the peak equals cfg.lr at the end of warm-up.
        peak = noam(d_model, cfg.warmup_steps)(cfg.warmup_steps)
        schedule = noam(d_model, cfg.warmup_steps, factor=cfg.lr / peak)
    elif cfg.optimizer == "radam":
        opt = torch.optim.RAdam(params, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)  # v2 §4.3
        schedule = warmup_constant(cfg.warmup_steps)
    elif cfg.optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        schedule = warmup_constant(cfg.warmup_steps)
    elif cfg.optimizer == "adamw-cosine":  # LaBERT §4.2: AdamW, linear warm-up, cosine decay
        opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.999), weight_decay=cfg.weight_decay)
        schedule = warmup_cosine(cfg.warmup_steps, max(total_steps, cfg.warmup_steps + 1))
    else:
        raise ValueError(f"unknown optimizer {cfg.optimizer!r}; choose adam-noam, radam, adamw or adamw-cosine")
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


@dataclasses.dataclass
class _Progress:
    epoch: int = 0
    batch_in_epoch: int = 0
    step: int = 0
    best_score: float = -math.inf
    best_epoch: int = -1


def train(cfg: TrainCfg, resume: bool = True, progress: bool = True) -> Path:
    """Train ``cfg.model`` on ``cfg.data`` with features from ``cfg.features``; returns the run directory.

    Re-running with the same ``cfg.out`` continues from the last checkpoint (``resume=True``). Under torchrun every
    process trains a shard of each epoch (:mod:`edgecap.workshop.training.distributed`) and rank 0 alone writes. With
    ``cfg.scst_epochs`` the cross-entropy epochs are followed by SCST (:mod:`edgecap.workshop.training.scst_loop`).
    """
    from edgecap.runtime.vocab import build_vocab, load_vocab
    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.data.sources import open_feature_source
    from edgecap.workshop.evaluation.cider import cider_d
    from edgecap.workshop.models import create_model, get_model_cfg
    from edgecap.workshop.torch_runtime.captioning import caption_bank

    run_dir = Path(cfg.out)
    ctx, device = init_distributed(resolve_device(cfg.device))
    if ctx.active and cfg.finetune_epochs:
        raise ValueError("end-to-end fine-tuning (--finetune-epochs) runs in one process; launch it without torchrun")
    seed_everything(cfg.seed)
    make_deterministic(device=device)  # fixed threads, deterministic kernels: the same weights under any load

    dataset = load_dataset(cfg.data)
    source = open_feature_source(cfg.features)
    train_records = dataset.split("train")
    val_records = dataset.split("val")
    if not train_records:
        raise ValueError(f"{cfg.data} has no training images")
    if cfg.val_images:
        val_records = val_records[: cfg.val_images]

    existing = ckpt.read_config(run_dir) if (run_dir / ckpt.CONFIG).is_file() else None
    model_cfg = get_model_cfg(cfg.model).replace(**cfg.model_overrides)
    if cfg.teacher and ctx.active:
        raise DistillationError("distillation runs in one process; launch it without torchrun")
    teacher = load_checked_teacher(cfg, source.feature_dim, device) if cfg.teacher else None
    if existing is not None and resume:
        if existing["model"]["name"] != cfg.model:
            raise ckpt.RunError(f"{run_dir} holds a {existing['model']['name']} run, not {cfg.model}")
        vocab = load_vocab(run_dir / ckpt.VOCAB)
    elif teacher is not None and cfg.kd_mode != "sequence":
        vocab = teacher.vocab  # word-level KD: the teacher's token ids
        if vocab.kind != model_cfg.vocab_kind:
            raise DistillationError(
                f"word-level distillation needs the teacher's vocabulary, but it is {vocab.kind!r} and {cfg.model} "
                f"uses {model_cfg.vocab_kind!r}: use --kd-mode sequence, or a teacher with a {model_cfg.vocab_kind} "
                "vocabulary"
            )
    else:  # every rank builds the same vocabulary from the same captions; rank 0 writes it
        captions: list[Sequence[str]] = [c for r in train_records for c in r.captions]
        vocab = build_vocab(
            captions,
            kind=model_cfg.vocab_kind,
            min_count=cfg.vocab_min_count,
            radix_base=model_cfg.radix_base,
        )

    model = create_model(cfg.model, vocab_size=vocab.size, feature_dim=source.feature_dim, **cfg.model_overrides)
    model.to(device)
    objective = kd_objective(cfg, model, teacher) if teacher is not None else None
    # Every check above ran before the run directory exists: a refused request leaves nothing behind. What this
    # call creates is removed again if the setup below fails (never a directory that was there before).
    created = _first_missing(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        if ctx.is_main and not (existing is not None and resume):
            vocab.save(run_dir / ckpt.VOCAB)
        distiller = None
        if teacher is not None:
            distiller = make_distiller(cfg, teacher, objective, source, train_records, run_dir, device)
        # Check the checkpoint before anything in the run directory is rewritten: a corrupt one raises here.
        state = ckpt.load_training_state(run_dir, model) if resume else None
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    config = {
        "edgecap_version": __version__,
        "model": {
            "name": cfg.model,
            "vocab_size": vocab.size,
            "feature_dim": source.feature_dim,
            "overrides": cfg.model_overrides,
            "cfg": model.cfg.to_dict(),
            "parameters": sum(p.numel() for p in model.parameters()),
        },
        "train": cfg.to_dict(),
        "data": str(Path(cfg.data).resolve()),
        "features": str(Path(cfg.features).resolve()),
        "backbone": getattr(source, "spec", None),
        "vocab": {"kind": vocab.kind, "size": vocab.size},
    }
    if distiller is not None:
        config["compression"] = [distiller.record]
    if existing is not None and resume and "backbone_before_end_to_end" in existing:
        # A resumed run that fine-tuned its backbone keeps naming the fine-tuned one (not the cache's).
        config["backbone"] = existing["backbone"]
        config["backbone_before_end_to_end"] = existing["backbone_before_end_to_end"]
    if ctx.is_main:
        ckpt.write_config(run_dir, config)
    ctx.barrier()

    local_images = len(epoch_order(len(train_records), cfg.seed, 0, ctx))
    batches_per_epoch = math.ceil(local_images / cfg.batch_size)
    total_steps = min(cfg.max_steps or cfg.epochs * batches_per_epoch, cfg.epochs * batches_per_epoch)
    optimizer, scheduler = build_optimizer(model, cfg, model.cfg.d_model, total_steps)
    prog = _Progress()
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
        prog = _Progress(**state["progress"])
        if ctx.rank:  # the checkpoint holds rank 0's RNG; the other ranks draw their own dropout masks
            torch.manual_seed(cfg.seed * 1_000_003 + prog.step * 101 + ctx.rank)
    call = wrap_ddp(model, ctx)

    train_bank = FeatureBank(source, [r.image_id for r in train_records])
    val_bank = FeatureBank(source, [r.image_id for r in val_records]) if val_records else None
    train_caps: list[Sequence[Sequence[str]]] = [r.captions for r in train_records]
    if distiller is not None and distiller.captions:  # sequence-level KD: the teacher's caption is one more target
        train_caps = [[*r.captions, distiller.captions[r.image_id]] for r in train_records]
    objective = distiller.objective if distiller is not None else None
    val_refs = {r.image_id: [" ".join(c) for c in r.captions] for r in val_records}
    started = time.monotonic()

    def save_state() -> None:
        if not ctx.is_main:
            return
        ckpt.save_training_state(
            run_dir,
            model,
            {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": ckpt.rng_state(),
                "progress": dataclasses.asdict(prog),
            },
        )

    def out_of_budget() -> bool:
        over_steps = cfg.max_steps and prog.step >= cfg.max_steps
        over_time = cfg.max_minutes and (time.monotonic() - started) / 60 >= cfg.max_minutes
        return bool(over_steps) or (bool(cfg.max_minutes) and ctx.agree(bool(over_time)))

    while prog.epoch < cfg.epochs and not out_of_budget():
        model.train()
        # The epoch's order depends only on (seed, epoch), so a resumed run sees the same batches.
        order = torch.tensor(epoch_order(len(train_records), cfg.seed, prog.epoch, ctx), dtype=torch.long)
        bar = ProgressBar(
            batches_per_epoch,
            f"epoch {prog.epoch + 1}/{cfg.epochs}",
            enabled=progress and ctx.is_main,
            initial=prog.batch_in_epoch,
        )
        for b in range(prog.batch_in_epoch, batches_per_epoch):
            rows = order[b * cfg.batch_size : (b + 1) * cfg.batch_size]
            cap_gen = torch.Generator().manual_seed(cfg.seed * 7_919 + prog.epoch * 1_000_003 + b)
            captions = pick_captions([train_caps[int(r)] for r in rows], cfg.captions_per_image, cap_gen)
            tokens = encode_captions(vocab, captions, cfg.max_words).to(device)
            visual = train_bank.batch(rows).to(device)
            loss, nll = _train_step(
                model, visual, tokens, vocab.pad_id, cfg, optimizer, scheduler, vocab.tokens_per_word, call, objective
            )
            prog.step += 1
            prog.batch_in_epoch = b + 1
            bar.update(1)
            bar.postfix(loss=f"{loss:.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
            if ctx.is_main and (prog.step % 20 == 0 or prog.step == 1 or b == batches_per_epoch - 1):
                ckpt.append_metrics(
                    run_dir,
                    {
                        "event": "train",
                        "epoch": prog.epoch,
                        "step": prog.step,
                        "loss": loss,
                        "nll": nll,
                        "lr": scheduler.get_last_lr()[0],
                        "elapsed_s": round(time.monotonic() - started, 2),
                    },
                )
            if cfg.save_every_steps and prog.step % cfg.save_every_steps == 0:
                save_state()
            if out_of_budget():
                break
        bar.close()
        epoch_done = prog.batch_in_epoch >= batches_per_epoch
        if epoch_done:
            finished_epoch = prog.epoch
            prog.epoch += 1
            prog.batch_in_epoch = 0
            validating = prog.epoch % cfg.val_every == 0 or prog.epoch == cfg.epochs
            if ctx.is_main and val_bank is not None and validating:
                model.eval()
                preds = caption_bank(
                    model, val_bank, vocab, beam_size=cfg.val_beam, max_words=cfg.max_words, device=device
                )
                score = cider_d({i: p for i, p in zip(val_bank.image_ids, preds, strict=True)}, val_refs)
                record = {
                    "event": "val",
                    "epoch": finished_epoch,
                    "step": prog.step,
                    "cider_d": score,
                    "elapsed_s": round(time.monotonic() - started, 2),
                    "example": preds[0],
                }
                ckpt.append_metrics(run_dir, record)
                if progress:
                    print(f"epoch {finished_epoch + 1}: val CIDEr-D {score * 100:.1f}  e.g. {preds[0]!r}")
                if score > prog.best_score:
                    prog.best_score = score
                    prog.best_epoch = finished_epoch
                    ckpt.save_weights(model, run_dir / ckpt.WEIGHTS)
        save_state()
        ctx.barrier()

    if ctx.is_main and not (run_dir / ckpt.WEIGHTS).is_file():
        # No validation split (or stopped before the first epoch ended): keep the latest weights.
        ckpt.save_weights(model, run_dir / ckpt.WEIGHTS)
    summary: dict[str, Any] = {
        "epochs_done": prog.epoch,
        "steps": prog.step,
        "best_val_cider_d": None if prog.best_score == -math.inf else prog.best_score,
        "best_epoch": prog.best_epoch,
        "train_seconds_this_session": round(time.monotonic() - started, 1),
    }
    if ctx.is_main:
        atomic_write_json(run_dir / "summary.json", summary)
    ctx.barrier()
    if cfg.finetune_epochs and prog.epoch >= cfg.epochs:  # frozen stage complete: end to end from images
        from edgecap.workshop.training.end_to_end import finetune_end_to_end

        finetune_end_to_end(cfg, run_dir, progress=progress)
    if cfg.scst_epochs and prog.epoch >= cfg.epochs:  # cross-entropy complete: self-critical training
        from edgecap.workshop.training.scst_loop import train_scst

        train_scst(cfg, run_dir, resume=resume, progress=progress, ctx=ctx, device=device)
    shutdown(ctx)
    return run_dir


def _train_step(
    model: torch.nn.Module,
    visual: VisualBatch,
    tokens: torch.Tensor,
    pad_id: int,
    cfg: TrainCfg,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    tokens_per_word: int = 1,
    call: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
    objective: Callable[..., tuple[torch.Tensor, ...]] | None = None,
) -> tuple[float, float]:
    """One optimiser step; ``call`` runs the objective through DDP in a multi-process job; ``objective`` replaces the
    family's own (distillation)."""
    if call is None:
        call = lambda objective, *args, **kwargs: objective(model, *args, **kwargs)  # noqa: E731
    loss, nll = call(objective or objective_for(model), visual, tokens, pad_id, cfg, tokens_per_word=tokens_per_word)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip > 0:
        if cfg.grad_clip_mode == "value":
            torch.nn.utils.clip_grad_value_(model.parameters(), cfg.grad_clip)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    scheduler.step()
    return float(loss.detach()), float(nll)


def _first_missing(path: Path) -> Path | None:
    """The outermost directory that creating ``path`` (with its parents) would create; None when it exists."""
    missing = None
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing
