"""End-to-end fine-tuning from pixels after training on frozen-backbone features (ExpansionNet v2 §4.3).

v2 trains each stage in two steps: first with the backbone frozen, on features computed once per image (the
feature cache: "the forward cost is replaced by a memory read"), then a short fine-tuning of backbone + captioner
together from images (2 epochs, lr 3e-5 annealed by 0.55 per epoch, RAdam β = (0.9, 0.98)). Here the first step is
the ordinary :func:`edgecap.workshop.training.loop.train` on a feature cache; this module is the second. It works for
every model family (it only needs ``encode_memory`` / ``decode_full``; a length-aware ``*-len`` model is fed each
caption's ground-truth level, as in the frozen stage) and every timm backbone the cache was built with:
EfficientNet-Lite0 by default, or e.g. a Swin from timm by name whose weights file is supplied locally.

What it writes into the run directory:

- ``weights.safetensors``: the fine-tuned captioner (the frozen-stage weights are kept as
  ``weights.frozen.safetensors``);
- ``backbone.safetensors``: the fine-tuned backbone; ``config.json``'s ``backbone`` spec now names this file (so
  ``edgecap export --backbone-weights RUN/backbone.safetensors`` and captioning from pixels use it);
- ``end_to_end.json``: the stage's settings, steps, last loss and val CIDEr-D (computed from images).

Departures: BatchNorm statistics stay frozen (the backbone runs in eval mode while its weights train; the batches
here are far smaller than the statistics were estimated on), and the old feature cache no longer matches the
backbone: re-extract it with the new weights before feature-based evaluation (v2 §4.3's step 4 does the same).
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from edgecap.runtime._io import atomic_path, atomic_write_json
from edgecap.workshop._progress import track
from edgecap.workshop.training import checkpoint as ckpt
from edgecap.workshop.training.batches import FeatureBank, encode_captions, pick_captions
from edgecap.workshop.training.config import TrainCfg
from edgecap.workshop.training.losses import label_smoothed_nll
from edgecap.workshop.training.objectives import level_inputs

__all__ = ["BACKBONE_WEIGHTS", "END_TO_END", "RADAM_BETAS", "finetune_end_to_end", "optimizer_step"]

BACKBONE_WEIGHTS = "backbone.safetensors"
END_TO_END = "end_to_end.json"
FROZEN_WEIGHTS = "weights.frozen.safetensors"
#: v2 §4.3: "All steps are trained using the RAdam optimizer (β1 = 0.9, β2 = 0.98)".
RADAM_BETAS = (0.9, 0.98)


class _ImageFeatures:
    """A feature source (``get``/``__contains__``/``feature_dim``) computed once by a backbone from image files."""

    def __init__(self, backbone: Any, records: Sequence[Any], batch_size: int = 16) -> None:
        self.feature_dim = backbone.feature_dim
        self._items: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        with torch.no_grad():
            for start in range(0, len(records), batch_size):
                chunk = records[start : start + batch_size]
                features, boxes = backbone(backbone.preprocess([r.path for r in chunk]))
                for r, f, b in zip(chunk, features.numpy(), boxes.numpy(), strict=True):
                    self._items[r.image_id] = (f, b)

    def get(self, image_id: str) -> tuple[np.ndarray, np.ndarray]:
        return self._items[image_id]

    def __contains__(self, image_id: object) -> bool:
        return image_id in self._items


def optimizer_step(
    loss: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    params: Sequence[torch.Tensor],
    grad_clip: float,
) -> None:
    """One step of a fine-tuning stage (end to end, QAT): gradients, global-norm clipping (0 disables), update."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    optimizer.step()
    scheduler.step()


def _check_images(records: Sequence[Any]) -> None:
    missing = [r.image_id for r in records if r.path is None or not Path(r.path).is_file()]
    if missing:
        raise FileNotFoundError(
            f"end-to-end fine-tuning reads the images, but {len(missing)} are missing (e.g. {missing[:3]})"
        )


def finetune_end_to_end(cfg: TrainCfg, run_dir: str | Path, progress: bool = True) -> Path:
    """Fine-tune the run's backbone and captioner together from images for ``cfg.finetune_epochs`` epochs.

    Args:
        cfg: the run's training cfg (``finetune_*`` fields, ``backbone_weights`` when the cache's backbone came
            from a local file, ``data``, ``captions_per_image``, ``label_smoothing``, ``grad_clip``, ``seed``).
        run_dir: a finished frozen-backbone run trained on a feature cache (not on region features).

    Returns:
        ``run_dir``. A run whose ``end_to_end.json`` exists is left as it is (the stage is not repeated).

    Raises:
        ValueError: the run has no backbone (region features) or the settings are invalid.
        FileNotFoundError: images of the training split are missing.
    """
    from edgecap.runtime.vocab import load_vocab
    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.evaluation.cider import cider_d
    from edgecap.workshop.models import cfg_from_dict, create_model_from_cfg
    from edgecap.workshop.models.backbone import create_backbone
    from edgecap.workshop.torch_runtime.captioning import caption_bank
    from edgecap.workshop.torch_runtime.images import backbone_from_spec
    from edgecap.workshop.torch_runtime.runtime import resolve_device

    run_dir = Path(run_dir)
    if (run_dir / END_TO_END).is_file():
        return run_dir
    if cfg.finetune_epochs < 1 or not cfg.finetune_lr > 0:
        raise ValueError(
            f"finetune_epochs must be >= 1 and finetune_lr > 0, got {cfg.finetune_epochs}, {cfg.finetune_lr}"
        )
    config = ckpt.read_config(run_dir)
    spec = config.get("backbone")
    if not spec:
        raise ValueError(
            f"{run_dir} was trained on region features without a backbone; end-to-end fine-tuning needs a run "
            "trained on a backbone feature cache (`edgecap features`)"
        )
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed + 1)
    backbone = backbone_from_spec(spec, weights=cfg.backbone_weights or None).to(device)
    vocab = load_vocab(run_dir / ckpt.VOCAB)
    model = create_model_from_cfg(cfg_from_dict(config["model"]["cfg"]), vocab.size)
    ckpt.load_weights(model, run_dir / ckpt.WEIGHTS)
    model.to(device)

    dataset = load_dataset(cfg.data)
    train_records = dataset.split("train")
    val_records = dataset.split("val")[: cfg.val_images or None]
    _check_images(train_records)
    batch_size = cfg.finetune_batch_size or cfg.batch_size
    params = [*backbone.parameters(), *model.parameters()]
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.RAdam(params, lr=cfg.finetune_lr, betas=RADAM_BETAS, weight_decay=cfg.weight_decay)
    batches = math.ceil(len(train_records) / batch_size)
    # v2 §4.3: annealed by 0.55 every epoch.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: cfg.finetune_anneal ** (it // batches))
    captions_all = [r.captions for r in train_records]
    started, step, loss_value = time.monotonic(), 0, float("nan")
    model.train()
    backbone.eval()  # BatchNorm statistics frozen; gradients still reach every backbone weight
    for epoch in range(cfg.finetune_epochs):
        order = torch.randperm(len(train_records), generator=torch.Generator().manual_seed(cfg.seed * 31 + epoch))
        for b in track(range(batches), f"end-to-end {epoch + 1}/{cfg.finetune_epochs}", enabled=progress):
            rows = order[b * batch_size : (b + 1) * batch_size].tolist()
            gen = torch.Generator().manual_seed(cfg.seed * 7_919 + epoch * 1_000_003 + b)
            captions = pick_captions([captions_all[r] for r in rows], cfg.captions_per_image, gen)
            tokens = encode_captions(vocab, captions, cfg.max_words).to(device)
            pixels = backbone.preprocess([train_records[r].path for r in rows]).to(device)
            features, boxes = backbone(pixels)
            memory = model.encode_memory(features, boxes, None).repeat_interleave(cfg.captions_per_image, dim=0)
            levels = level_inputs(model, tokens, vocab.pad_id, vocab.tokens_per_word)  # a *-len model's levels
            logprobs = model.decode_full(memory, None, tokens[:, :-1], **levels)
            loss, _ = label_smoothed_nll(logprobs.float(), tokens[:, 1:], vocab.pad_id, cfg.label_smoothing)
            optimizer_step(loss, optimizer, scheduler, params, cfg.grad_clip)
            step += 1
            loss_value = float(loss.detach())
            ckpt.append_metrics(
                run_dir,
                {
                    "event": "end_to_end",
                    "epoch": epoch,
                    "step": step,
                    "loss": loss_value,
                    "lr": scheduler.get_last_lr()[0],
                },
            )

    model.eval()
    score = None
    if val_records:
        _check_images(val_records)
        bank = FeatureBank(_ImageFeatures(backbone, val_records), [r.image_id for r in val_records])
        preds = caption_bank(model, bank, vocab, beam_size=cfg.val_beam, max_words=cfg.max_words, device=device)
        refs = {r.image_id: [" ".join(c) for c in r.captions] for r in val_records}
        score = cider_d({i: p for i, p in zip(bank.image_ids, preds, strict=True)}, refs)

    # Write the new weights, then point the run at them (config last, so a crash leaves the frozen run intact).
    model.cpu()
    backbone.cpu()
    if not (run_dir / FROZEN_WEIGHTS).is_file():
        with atomic_path(run_dir / FROZEN_WEIGHTS) as tmp:
            shutil.copyfile(run_dir / ckpt.WEIGHTS, tmp)
    with atomic_path(run_dir / BACKBONE_WEIGHTS) as tmp:
        save_file({k: v.contiguous() for k, v in backbone.model.state_dict().items()}, str(tmp))
    ckpt.save_weights(model, run_dir / ckpt.WEIGHTS)
    tuned = create_backbone(spec["name"], weights=run_dir / BACKBONE_WEIGHTS, image_size=int(spec["image_size"]))
    config["backbone_before_end_to_end"] = spec
    config["backbone"] = tuned.spec
    ckpt.write_config(run_dir, config)
    summary = {
        "epochs": cfg.finetune_epochs,
        "steps": step,
        "lr": cfg.finetune_lr,
        "anneal": cfg.finetune_anneal,
        "batch_size": batch_size,
        "optimizer": {"name": "radam", "betas": list(RADAM_BETAS)},
        "last_loss": loss_value,
        "val_cider_d_from_images": score,
        "seconds": round(time.monotonic() - started, 1),
        "note": "the feature cache predates these backbone weights; re-extract features before feature-based eval",
    }
    atomic_write_json(run_dir / END_TO_END, summary)
    return run_dir
