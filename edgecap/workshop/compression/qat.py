"""Quantisation-aware training (QAT): fine-tune a trained run under the fake quantisation of an INT8 preset, so its
INT8 export keeps the FP32 captions (``edgecap train qat RUN --epochs N --out QAT_RUN``).

A run trained on a backbone's feature cache is fine-tuned end to end from images, the backbone fake-quantised too:
a pixels-in bundle quantises the backbone's convolutions with the rest (ExpansionNet v2 §4.3's end-to-end stage,
``edgecap.workshop.training.end_to_end``, with fake quantisation on). A region-feature run is fine-tuned on its
features. The new run is an ordinary run (the weights are left on the INT8 grid, the tuned backbone in
``backbone.safetensors``), exported with ``edgecap export --int8 --target T`` like any other; its
``config.json`` records the step under ``compression`` with the parent run, against whose FP32 model the export's
task-level check compares. The directory appears only when complete (written next to it, then renamed).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from edgecap.runtime._io import atomic_write_json
from edgecap.workshop._progress import track
from edgecap.workshop.compression.fake_quant import (
    attach_fake_quant,
    freeze_observers,
    remove_fake_quant,
    scheme_for,
)
from edgecap.workshop.training import checkpoint as ckpt
from edgecap.workshop.training.batches import FeatureBank, VisualBatch, encode_captions, pick_captions
from edgecap.workshop.training.config import TrainCfg

__all__ = ["QAT_SUMMARY", "QatError", "qat_run"]

QAT_SUMMARY = "qat.json"


class QatError(ValueError):
    """A QAT request that cannot run: a bad output directory, settings or parent run."""


def _visual_source(config: dict[str, Any], cfg: TrainCfg, records: list[Any], device: torch.device) -> Any:
    """The backbone (end to end from images) or None (the run's feature source)."""
    if not config.get("backbone"):
        return None
    from edgecap.workshop.torch_runtime.images import backbone_from_spec
    from edgecap.workshop.training.end_to_end import _check_images

    _check_images(records)
    return backbone_from_spec(config["backbone"], weights=cfg.backbone_weights or None).to(device)


def qat_run(
    parent: str | Path,
    out: str | Path,
    *,
    epochs: int = 1,
    target: str = "cpu-auto",
    lr: float = 3e-5,
    batch_size: int = 0,
    max_steps: int = 0,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Fine-tune ``parent``'s best weights with ``target``'s fake quantisation into the new run ``out``.

    Raises:
        QatError: ``out`` exists, or the settings are invalid.
        FileNotFoundError: the images of an end-to-end run are missing.
    """
    from edgecap.runtime.vocab import load_vocab
    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.data.sources import open_feature_source
    from edgecap.workshop.evaluation.cider import cider_d
    from edgecap.workshop.export.calibration.presets import get_preset
    from edgecap.workshop.models import cfg_from_dict, create_model_from_cfg
    from edgecap.workshop.torch_runtime.captioning import caption_bank
    from edgecap.workshop.torch_runtime.runtime import resolve_device
    from edgecap.workshop.training.end_to_end import BACKBONE_WEIGHTS, RADAM_BETAS, _ImageFeatures, optimizer_step
    from edgecap.workshop.training.objectives import objective_for

    parent, out = Path(parent).resolve(), Path(out)
    if out.exists():
        raise QatError(f"{out} exists: QAT writes a new run (the FP32 parent stays as it is)")
    if epochs < 1 or not lr > 0:
        raise QatError(f"QAT needs epochs >= 1 and lr > 0, got {epochs}, {lr}")
    config = ckpt.read_config(parent)
    cfg = TrainCfg.from_dict(config["train"])
    preset = get_preset(target)
    schemes = {role: scheme_for(preset, role) for role in ("encoder", "step")}
    torch_device = resolve_device(device)
    torch.manual_seed(seed)

    vocab = load_vocab(parent / ckpt.VOCAB)
    model = create_model_from_cfg(cfg_from_dict(config["model"]["cfg"]), vocab.size)
    ckpt.load_weights(model, parent / ckpt.WEIGHTS)
    model.to(torch_device)
    dataset = load_dataset(cfg.data)
    train_records = dataset.split("train")
    val_records = dataset.split("val")[: cfg.val_images or None]
    backbone = _visual_source(config, cfg, train_records, torch_device)
    layers = attach_fake_quant(model, schemes)
    if backbone is not None:
        layers += attach_fake_quant(backbone.model, schemes, role="encoder")
        backbone.eval()  # BatchNorm statistics frozen (folded into the fake-quantised convs)
        bank = None
    else:
        source = open_feature_source(cfg.features)
        bank = FeatureBank(source, [r.image_id for r in train_records])

    size = batch_size or cfg.batch_size
    params = [p for p in model.parameters() if p.requires_grad]
    if backbone is not None:
        params += [p for p in backbone.parameters()]
        for p in params:
            p.requires_grad_(True)
    optimizer = torch.optim.RAdam(params, lr=lr, betas=RADAM_BETAS)
    batches = math.ceil(len(train_records) / size)
    total = min(max_steps or epochs * batches, epochs * batches)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: 0.5 * (1 + math.cos(math.pi * it / total)))
    objective = objective_for(model)
    captions_all = [r.captions for r in train_records]
    started, step, loss_value = time.monotonic(), 0, float("nan")
    model.train()
    for epoch in range(epochs):
        order = torch.randperm(len(train_records), generator=torch.Generator().manual_seed(seed * 31 + epoch))
        for b in track(range(batches), f"QAT {epoch + 1}/{epochs}", enabled=progress):
            if step >= total:
                break
            rows = order[b * size : (b + 1) * size]
            gen = torch.Generator().manual_seed(seed * 7_919 + epoch * 1_000_003 + b)
            captions = pick_captions([captions_all[int(r)] for r in rows], cfg.captions_per_image, gen)
            tokens = encode_captions(vocab, captions, cfg.max_words).to(torch_device)
            if backbone is not None:
                pixels = backbone.preprocess([train_records[int(r)].path for r in rows]).to(torch_device)
                features, boxes = backbone(pixels)
                mask = torch.ones(features.shape[:2], dtype=torch.bool, device=torch_device)
                visual = VisualBatch(features, boxes, mask)
            else:
                visual = bank.batch(rows).to(torch_device)  # type: ignore[union-attr]
            loss, _ = objective(model, visual, tokens, vocab.pad_id, cfg, tokens_per_word=vocab.tokens_per_word)
            optimizer_step(loss, optimizer, scheduler, params, cfg.grad_clip)
            step += 1
            loss_value = float(loss.detach())
    if not math.isfinite(loss_value):
        raise QatError(f"QAT diverged (loss {loss_value}); try a smaller --lr than {lr}")

    model.eval()
    freeze_observers(model)
    score = None
    if val_records:
        if backbone is not None:
            freeze_observers(backbone.model)
            val_source: Any = _ImageFeatures(backbone, val_records)
        else:
            val_source = open_feature_source(cfg.features)
        val_bank = FeatureBank(val_source, [r.image_id for r in val_records])
        preds = caption_bank(
            model, val_bank, vocab, beam_size=cfg.val_beam, max_words=cfg.max_words, device=torch_device
        )
        refs = {r.image_id: [" ".join(c) for c in r.captions] for r in val_records}
        score = cider_d({i: p for i, p in zip(val_bank.image_ids, preds, strict=True)}, refs)

    remove_fake_quant(model)
    staging = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        shutil.copyfile(parent / ckpt.VOCAB, staging / ckpt.VOCAB)
        ckpt.save_weights(model.cpu(), staging / ckpt.WEIGHTS)
        if backbone is not None:
            from edgecap.workshop.models.backbone import create_backbone

            remove_fake_quant(backbone.model)
            backbone.cpu()
            tuned_file = staging / BACKBONE_WEIGHTS
            save_file({k: v.contiguous() for k, v in backbone.model.state_dict().items()}, str(tuned_file))
            spec = config["backbone"]
            tuned = create_backbone(spec["name"], weights=tuned_file, image_size=int(spec["image_size"]))
            config["backbone_before_qat"] = spec
            config["backbone"] = tuned.spec
        record = {
            "kind": "qat",
            "epochs": epochs,
            "steps": step,
            "target": target,
            "preset": preset.name,
            "lr": lr,
            "end_to_end": backbone is not None,
            "layers": layers,
            "schemes": {role: s.describe() for role, s in schemes.items()},
            "val_cider_d": score,
            "last_loss": loss_value,
            "seconds": round(time.monotonic() - started, 1),
            "parent": str(parent),
        }
        config["train"] = cfg.replace(out=str(out.resolve())).to_dict()
        config["compression"] = [*config.get("compression", []), record]
        atomic_write_json(staging / QAT_SUMMARY, record)
        ckpt.write_config(staging, config)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
