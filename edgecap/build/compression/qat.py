"""Quantisation-aware training (QAT): fine-tune a trained run under the fake quantisation of an INT8 preset, so its
INT8 export keeps the FP32 captions (``edgecap train --init RUN --qat-epochs N --out QAT_RUN``).

A run trained on a backbone's feature cache is fine-tuned end to end from images, the backbone fake-quantised too:
a pixels-in bundle quantises the backbone's convolutions with the rest (ExpansionNet v2 §4.3's end-to-end stage,
``edgecap.build.training.end_to_end``, with fake quantisation on). A region-feature run is fine-tuned on its
features. The new run is an ordinary run (the weights are left on the INT8 grid, the tuned backbone in
``backbone.safetensors``), exported with ``edgecap export --int8 --target T`` like any other; its
``config.json`` records the step under ``compression`` with the parent run, against whose FP32 model the export's
task-level check compares. The directory appears only when complete (written next to it, then renamed).

What the fine-tuning optimises (``objective``):

- ``"parent"`` (autoregressive families; the default there): self-distillation from the FP32 parent, as in
  quantisation-aware distillation (Mishra & Marr 2018 §3; Kim et al. 2019, "QKD"): on teacher-forced prefixes of the
  training captions, ``KL(p_parent ‖ p_qat)`` per token (``distill.kd_loss``, α = 1, T = 1), the parent seeing its own
  FP32 input (its own backbone's features, end to end) and the fake-quantised model running without dropout. The
  goal of QAT is an INT8 model that captions like the FP32 one, so this is what it learns. Measured on the
  quickstart's acort-xsmall, captioner alone on its features (60 steps, batch 16, lr 3e-5, 100 held-out images,
  beam 3): the fake-quantised model keeps 85 % of the parent's captions after distillation, 62 % without
  fine-tuning, 34 % after fine-tuning on the captions (dropout on), which moves the FP32 model itself.
- ``"captions"`` (mask-predict LaBERT, whose refine passes have no per-token distributions to match; or asked
  for): the family's own objective on the ground-truth captions, dropout on, as in ordinary fine-tuning.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from edgecap.build._progress import track
from edgecap.build.compression.fake_quant import (
    attach_fake_quant,
    freeze_observers,
    remove_fake_quant,
    scheme_for,
)
from edgecap.build.training import checkpoint as ckpt
from edgecap.build.training.batches import FeatureBank, VisualBatch, encode_captions, pick_captions
from edgecap.build.training.config import TrainCfg
from edgecap.runtime._io import atomic_write_json

__all__ = ["QAT_OBJECTIVES", "QAT_SUMMARY", "QatError", "qat_run"]

QAT_SUMMARY = "qat.json"
#: What QAT fine-tunes towards: the FP32 parent's token distributions, or the ground-truth captions.
QAT_OBJECTIVES = ("parent", "captions")


class QatError(ValueError):
    """A QAT request that cannot run: a bad output directory, settings or parent run."""


def _visual_source(config: dict[str, Any], cfg: TrainCfg, records: list[Any], device: torch.device) -> Any:
    """The backbone (end to end from images) or None (the run's feature source)."""
    if not config.get("backbone"):
        return None
    from edgecap.build.torch_runtime.images import backbone_from_spec
    from edgecap.build.training.end_to_end import _check_images

    _check_images(records)
    return backbone_from_spec(config["backbone"], weights=cfg.backbone_weights or None).to(device)


def _objective_name(requested: str | None, model: Any) -> str:
    """``requested``, or the family's default: ``"parent"`` where the model has per-token distributions."""
    from edgecap.build.training.objectives import cross_entropy, objective_for

    autoregressive = objective_for(model) is cross_entropy
    name = requested or ("parent" if autoregressive else "captions")
    if name not in QAT_OBJECTIVES:
        raise QatError(f"QAT objective must be one of {list(QAT_OBJECTIVES)}, got {name!r}")
    if name == "parent" and not autoregressive:
        raise QatError(
            "distilling from the parent needs per-token distributions, which a mask-predict model (LaBERT) does not "
            "decode with: use the 'captions' objective"
        )
    return name


def _distillation_loss(
    model: Any, parent: Any, visual: Any, parent_visual: Any, tokens: torch.Tensor, pad_id: int, cfg: TrainCfg,
    tokens_per_word: int,
) -> torch.Tensor:  # fmt: skip
    """``KL(p_parent ‖ p_model)`` per non-pad token on the teacher-forced ``tokens`` (``captions_per_image`` rows per
    image); the parent reads ``parent_visual`` (its own FP32 features) without gradients."""
    from edgecap.build.compression.distill import kd_loss
    from edgecap.build.training.objectives import level_inputs

    per_image = cfg.captions_per_image
    mask = visual.mask.repeat_interleave(per_image, dim=0)
    memory = model.encode_memory(visual.features, visual.boxes, visual.mask).repeat_interleave(per_image, dim=0)
    student = model.decode_full(memory, mask, tokens[:, :-1], **level_inputs(model, tokens, pad_id, tokens_per_word))
    with torch.no_grad():
        p_memory = parent.encode_memory(parent_visual.features, parent_visual.boxes, parent_visual.mask)
        teacher = parent.decode_full(
            p_memory.repeat_interleave(per_image, dim=0),
            parent_visual.mask.repeat_interleave(per_image, dim=0),
            tokens[:, :-1],
            **level_inputs(parent, tokens, pad_id, tokens_per_word),
        )
    loss, _ = kd_loss(student.float(), teacher.float(), tokens[:, 1:], pad_id, temperature=1.0, alpha=1.0)
    return loss


def qat_run(
    parent: str | Path,
    out: str | Path,
    *,
    epochs: int = 1,
    target: str = "cpu-auto",
    lr: float = 3e-5,
    batch_size: int = 0,
    max_steps: int = 0,
    objective: str | None = None,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Fine-tune ``parent``'s best weights with ``target``'s fake quantisation into the new run ``out``.

    ``objective``: one of :data:`QAT_OBJECTIVES`; None picks ``"parent"`` for autoregressive families and
    ``"captions"`` for mask-predict ones (see the module docstring).

    Raises:
        QatError: ``out`` exists, or the settings are invalid.
        FileNotFoundError: the images of an end-to-end run are missing.
    """
    from edgecap.build.data.datasets import load_dataset
    from edgecap.build.data.sources import open_feature_source
    from edgecap.build.evaluation.cider import cider_d
    from edgecap.build.export.calibration.presets import get_preset
    from edgecap.build.models import cfg_from_dict, create_model_from_cfg
    from edgecap.build.torch_runtime.captioning import caption_bank
    from edgecap.build.torch_runtime.runtime import resolve_device
    from edgecap.build.training.end_to_end import BACKBONE_WEIGHTS, RADAM_BETAS, _ImageFeatures, optimizer_step
    from edgecap.build.training.objectives import objective_for
    from edgecap.runtime.vocab import load_vocab

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
    objective_name = _objective_name(objective, model)
    dataset = load_dataset(cfg.data)
    train_records = dataset.split("train")
    val_records = dataset.split("val")[: cfg.val_images or None]
    backbone = _visual_source(config, cfg, train_records, torch_device)
    # the FP32 parent (captioner and backbone), which "parent" distils from and the val agreement compares with
    fp32 = copy.deepcopy(model).eval().requires_grad_(False)
    fp32_backbone = copy.deepcopy(backbone).eval().requires_grad_(False) if backbone is not None else None
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
    family_objective = objective_for(model)
    captions_all = [r.captions for r in train_records]
    started, step, loss_value = time.monotonic(), 0, float("nan")
    model.train(objective_name == "captions")  # distillation: no dropout, the parent has none either
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
            if objective_name == "parent":
                parent_visual = visual
                if fp32_backbone is not None:
                    with torch.no_grad():
                        parent_features, parent_boxes = fp32_backbone(pixels)
                    parent_visual = VisualBatch(parent_features, parent_boxes, mask)
                loss = _distillation_loss(
                    model, fp32, visual, parent_visual, tokens, vocab.pad_id, cfg, vocab.tokens_per_word
                )
            else:
                loss, _ = family_objective(
                    model, visual, tokens, vocab.pad_id, cfg, tokens_per_word=vocab.tokens_per_word
                )
            optimizer_step(loss, optimizer, scheduler, params, cfg.grad_clip)
            step += 1
            loss_value = float(loss.detach())
    if not math.isfinite(loss_value):
        raise QatError(f"QAT diverged (loss {loss_value}); try a smaller --qat-lr than {lr}")

    model.eval()
    freeze_observers(model)
    score = agreement = None
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
        # the same images through the FP32 parent (its own backbone): how many captions QAT kept
        parent_source = _ImageFeatures(fp32_backbone, val_records) if fp32_backbone is not None else val_source
        parent_preds = caption_bank(
            fp32, FeatureBank(parent_source, val_bank.image_ids), vocab, beam_size=cfg.val_beam,
            max_words=cfg.max_words, device=torch_device,
        )  # fmt: skip
        agreement = sum(a == b for a, b in zip(preds, parent_preds, strict=True)) / len(preds)

    remove_fake_quant(model)
    staging = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        shutil.copyfile(parent / ckpt.VOCAB, staging / ckpt.VOCAB)
        ckpt.save_weights(model.cpu(), staging / ckpt.WEIGHTS)
        if backbone is not None:
            from edgecap.build.models.backbone import create_backbone

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
            "objective": objective_name,
            "val_cider_d": score,
            "val_agreement_with_parent": agreement,
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
