"""What structured pruning and 2:4 sparsity share: a run's training batches, a short cross-entropy fine-tune and
writing the derived run.

The fine-tune reuses the training loop's pieces (:func:`~edgecap.workshop.training.loop.build_optimizer`, its
``_train_step``, the feature bank, caption sampling and the family's objective), so a pruned or sparse model is
trained with exactly the loss and clipping of ``edgecap train``; only the schedule differs: AdamW from ``lr`` with a
cosine decay to 0 over the fine-tune and no warm-up (it starts from trained weights; a constant rate left the
validation score swinging by ±3 CIDEr-D from epoch to epoch on the quickstart data). The best epoch by validation
CIDEr-D is kept, epoch 0 (the model before fine-tuning) included, so fine-tuning never makes the result worse on the
validation split.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edgecap._version import __version__
from edgecap.runtime._io import atomic_directory, atomic_write_json
from edgecap.workshop.training import checkpoint as ckpt
from edgecap.workshop.training.batches import FeatureBank, VisualBatch, encode_captions, pick_captions
from edgecap.workshop.training.config import TrainCfg

__all__ = ["RunData", "finetune", "load_run_data", "write_derived_run"]


@dataclass
class RunData:
    """A run's training/validation features and captions, opened from the paths its ``config.json`` records."""

    train_cfg: TrainCfg
    vocab: Any
    train_bank: FeatureBank
    train_caps: list[Any]
    val_bank: FeatureBank | None
    val_refs: dict[str, list[str]]

    def batches(self, epoch: int, batch_size: int | None = None) -> Iterator[tuple[VisualBatch, torch.Tensor]]:
        """One epoch of (visual, tokens) batches in the training loop's (seed, epoch) order."""
        from edgecap.workshop.training.distributed import Dist, epoch_order

        cfg = self.train_cfg
        size = batch_size or cfg.batch_size
        order = torch.tensor(epoch_order(len(self.train_caps), cfg.seed, epoch, Dist()), dtype=torch.long)
        for b in range(math.ceil(len(order) / size)):
            rows = order[b * size : (b + 1) * size]
            gen = torch.Generator().manual_seed(cfg.seed * 7_919 + epoch * 1_000_003 + b)
            captions = pick_captions([self.train_caps[int(r)] for r in rows], cfg.captions_per_image, gen)
            yield self.train_bank.batch(rows), encode_captions(self.vocab, captions, cfg.max_words)

    def loss(self, model: torch.nn.Module, visual: VisualBatch, tokens: torch.Tensor) -> torch.Tensor:
        """The family's training objective (label-smoothed cross-entropy for the autoregressive families)."""
        from edgecap.workshop.training.objectives import objective_for

        loss, _ = objective_for(model)(
            model, visual, tokens, self.vocab.pad_id, self.train_cfg, tokens_per_word=self.vocab.tokens_per_word
        )
        return loss

    def val_cider(self, model: torch.nn.Module) -> float | None:
        """Greedy validation CIDEr-D (None without a validation split)."""
        if self.val_bank is None:
            return None
        from edgecap.workshop.evaluation.cider import cider_d
        from edgecap.workshop.torch_runtime.captioning import caption_bank

        model.eval()
        preds = caption_bank(model, self.val_bank, self.vocab, beam_size=1, max_words=self.train_cfg.max_words)
        return float(cider_d(dict(zip(self.val_bank.image_ids, preds, strict=True)), self.val_refs))


def load_run_data(config: dict[str, Any], vocab: Any) -> RunData:
    """Open the dataset and feature cache a run was trained on (``config["data"]``, ``config["features"]``)."""
    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.data.sources import open_feature_source

    train_cfg = TrainCfg.from_dict(dict(config["train"]))
    dataset = load_dataset(config["data"])
    source = open_feature_source(config["features"])
    train_records = dataset.split("train")
    if not train_records:
        raise ValueError(f"{config['data']} has no training images")
    val_records = dataset.split("val")
    if train_cfg.val_images:
        val_records = val_records[: train_cfg.val_images]
    return RunData(
        train_cfg=train_cfg,
        vocab=vocab,
        train_bank=FeatureBank(source, [r.image_id for r in train_records]),
        train_caps=[r.captions for r in train_records],
        val_bank=FeatureBank(source, [r.image_id for r in val_records]) if val_records else None,
        val_refs={r.image_id: [" ".join(c) for c in r.captions] for r in val_records},
    )


def finetune(
    model: torch.nn.Module,
    data: RunData,
    epochs: int,
    lr: float,
    log: Callable[[dict[str, Any]], None],
    max_steps: int = 0,
) -> dict[str, Any]:
    """Fine-tune ``model`` in place with cross-entropy for ``epochs`` (at most ``max_steps`` steps when > 0) and
    leave it holding the best weights by validation CIDEr-D (the starting weights count as epoch 0).

    Masks a caller set up as parametrizations (2:4 sparsity) stay in force: the optimiser sees only their
    ``original`` tensors and the mask multiplies every forward pass.
    """
    from edgecap.workshop.training.loop import _train_step, build_optimizer

    cfg = data.train_cfg.replace(optimizer="adamw-cosine", lr=lr, warmup_steps=0, weight_decay=0.0)
    per_epoch = math.ceil(len(data.train_caps) / cfg.batch_size)
    total = min(max_steps or epochs * per_epoch, epochs * per_epoch)
    optimizer, scheduler = build_optimizer(model, cfg, 0, total_steps=total)
    best = data.val_cider(model)
    log({"event": "val", "epoch": 0, "cider_d": best})
    best_state = _snapshot(model)
    best_epoch, step, started = 0, 0, time.monotonic()
    for epoch in range(1, epochs + 1):
        model.train()
        for visual, tokens in data.batches(epoch - 1):
            loss, _ = _train_step(
                model, visual, tokens, data.vocab.pad_id, cfg, optimizer, scheduler, data.vocab.tokens_per_word
            )
            step += 1
            if step % 20 == 0 or step == 1:
                log({"event": "train", "epoch": epoch, "step": step, "loss": loss})
            if max_steps and step >= max_steps:
                break
        score = data.val_cider(model)
        log({"event": "val", "epoch": epoch, "step": step, "cider_d": score})
        if best is None or (score is not None and score > best):
            best, best_epoch = score, epoch
            best_state = _snapshot(model)
        if max_steps and step >= max_steps:
            break
    with torch.no_grad():
        for name, tensor in _tensors(model):
            tensor.copy_(best_state[name])
    model.eval()
    return {
        "steps": step,
        "best_epoch": best_epoch,
        "best_val_cider_d": best,
        "finetune_seconds": round(time.monotonic() - started, 1),
    }


def _tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and buffer by name, parametrization masks included (``state_dict`` leaves those out)."""
    return [*model.named_parameters(), *model.named_buffers()]


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in _tensors(model)}


def write_derived_run(
    out: Path,
    parent: Path,
    config: dict[str, Any],
    model: torch.nn.Module,
    metrics: list[dict[str, Any]],
    summary: dict[str, Any],
) -> Path:
    """Write a run directory derived from ``parent`` atomically: ``config.json`` (``config``, whose model entry is
    refreshed from ``model``), the parent's vocabulary, the model's weights, its metrics and summary."""
    config = dict(config)
    config["edgecap_version"] = __version__
    model_entry = dict(config["model"])
    cfg: Any = model.cfg
    model_entry["cfg"] = cfg.to_dict()
    model_entry["parameters"] = sum(p.numel() for p in model.parameters())
    config["model"] = model_entry
    with atomic_directory(out) as tmp:
        ckpt.write_config(tmp, config)
        shutil.copyfile(parent / ckpt.VOCAB, tmp / ckpt.VOCAB)
        ckpt.save_weights(model, tmp / ckpt.WEIGHTS)
        for record in metrics:
            ckpt.append_metrics(tmp, record)
        atomic_write_json(tmp / "summary.json", summary)
    return out
