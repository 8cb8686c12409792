"""The task-level check: CIDEr-D and caption agreement of each variant on ONNX Runtime (CPU) against the torch FP32
model, on the held-out set (``edgecap.workshop.export.calibration.compare_decoders``).

A length-controllable autoregressive model (``*-len``) is checked at every length level: each level is its own
caption regime (a short caption can survive quantisation where a long one drifts), and users pick the level at run
time. The record keeps the default level's numbers at the top (the shape of bundles exported before, which readers
still take) and adds every level under ``levels`` (see ``edgecap.runtime.bundle.manifest.quality_levels``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from edgecap.workshop.export.bundling.held_out import HeldOut
from edgecap.workshop.export.bundling.images import EncoderInputs

__all__ = [
    "PixelReference",
    "check_levels",
    "fp32_references",
    "held_out_references",
    "task_check",
    "torch_batches",
]


class PixelReference:
    """The torch FP32 reference of a bundle whose encoder graph contains the backbone: ``pixel_values`` through the
    torch backbone, then the captioner's own decoder adapter (a :class:`~edgecap.runtime.decoding.StepModel`, or
    LaBERT's
    refine model), to which everything but ``encode`` is handed on. Inputs other than the pixels (``length_level``
    of a ``*-len`` model) go on to the inner encoder."""

    def __init__(self, backbone: torch.nn.Module, inner: Any) -> None:
        self.backbone, self.inner = backbone.eval(), inner

    def encode(self, inputs: Mapping[str, torch.Tensor]) -> Any:
        with torch.inference_mode():
            features, boxes = self.backbone(torch.as_tensor(inputs["pixel_values"]))
        rest = {k: v for k, v in inputs.items() if k != "pixel_values"}
        return self.inner.encode({**rest, "features": features, "boxes": boxes})

    def __getattr__(self, name: str) -> Any:
        if name in ("backbone", "inner"):  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def torch_batches(images: EncoderInputs) -> list[dict[str, torch.Tensor]]:
    return [{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()} for batch in images.batches]


def fp32_references(reference: Any, batches: Sequence[Mapping[str, torch.Tensor]], vocab: Any, cfg: Any) -> list:
    from edgecap.runtime.captioning import captions_from_hypotheses
    from edgecap.runtime.decoding import decode

    out: list[list[str]] = []
    for batch in batches:
        out.extend([c] for c in captions_from_hypotheses(vocab, decode(reference, batch, cfg)))
    return out


def check_levels(spec: Any, cfg: Any) -> list[int | None]:
    """The length levels the task check decodes at: every level of a length-controllable autoregressive model, else
    the decode config's own (None, or LaBERT's default level: mask-predict is checked where it is deployed)."""
    levels = len(getattr(spec, "length_levels", ()) or ())
    if cfg.strategy == "mask_predict" or cfg.length_level is None or not levels:
        return [cfg.length_level]
    return list(range(1, levels + 1))


def held_out_references(
    reference: Any, held_out: HeldOut, vocab: Any, cfg: Any, spec: Any
) -> dict[int | None, list[list[str]]]:
    """Per checked level, the held-out set's references: its human captions, or else the torch FP32 captions at that
    level (a caption regime is scored against its own reference, not the default level's)."""
    levels = check_levels(spec, cfg)
    if held_out.references is not None:
        return {level: held_out.references for level in levels}
    batches = torch_batches(held_out.inputs)
    return {level: fp32_references(reference, batches, vocab, cfg.replace(length_level=level)) for level in levels}


def task_check(
    reference: Any,
    models: Mapping[str, Any],
    spec: Any,
    held_out: HeldOut,
    references: Mapping[int | None, list[list[str]]] | list[list[str]],
    vocab: Any,
    cfg: Any,
    schemes: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """CIDEr-D of the torch FP32 reference and of ``models`` on ONNX Runtime (CPU), their difference, agreement: at
    the default level on top, and per level under ``levels`` for a length-controllable autoregressive model.

    ``references``: per level (:func:`held_out_references`), or one list used at every level. ``schemes``: the
    variant's INT8 scheme records; a row-coupled one (a ``dynamic`` step) is decoded image by image, as
    ``Captioner`` serves it, so the recorded quality is that of the captions users get."""
    from edgecap.runtime.backends.onnxruntime.decoders import create_onnxruntime_decoder
    from edgecap.runtime.backends.onnxruntime.session import row_coupled_roles
    from edgecap.runtime.backends.threads import plan_threads
    from edgecap.workshop.export.calibration import compare_decoders

    levels = check_levels(spec, cfg)
    by_level = references if isinstance(references, Mapping) else dict.fromkeys(levels, references)
    batches = torch_batches(held_out.inputs)
    threads = plan_threads("auto").runtime_options()  # as Captioner.load: no spinning next to torch's threads
    measured: dict[int | None, dict[str, Any]] = {}
    with create_onnxruntime_decoder(
        models,
        spec.state_names,
        updated_state_names=spec.step_state_names,
        rows_independent=not row_coupled_roles(schemes or {}),
        providers=("cpu",),
        **threads,
    ) as candidate:
        for level in levels:
            level_cfg = cfg.replace(length_level=level)
            report = compare_decoders(reference, candidate, batches, by_level[level], vocab, level_cfg)
            measured[level] = _quality_fields(report)
    default = cfg.length_level if cfg.length_level in measured else levels[0]
    record: dict[str, Any] = {
        "set": held_out.description,
        "images": len(held_out.inputs),
        "references": "human captions" if held_out.references is not None else "torch FP32 captions",
        "reference": "torch FP32",
        "beam": cfg.beam_size if cfg.strategy == "beam" else 1,
        "decoding": cfg.strategy,
        "length_level": default,
        **measured[default],
    }
    if len(levels) > 1:
        record["levels"] = {str(level): fields for level, fields in measured.items()}
    return record


def _quality_fields(measured: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's fields from :func:`compare_decoders`'s report (agreements as fractions; CIDEr-D on the
    pycocoevalcap scale, where 1.0 reads "100")."""
    return {
        "reference_cider_d": float(measured["cider_d_reference"]),
        "candidate_cider_d": float(measured["cider_d_candidate"]),
        "cider_d_delta": float(measured["cider_d_delta"]),
        "agreement": float(measured["caption_agreement_pct"]) / 100.0,
        "token_agreement": float(measured["token_agreement_pct"]) / 100.0,
        "mean_length_reference": float(measured["mean_length_reference"]),
        "mean_length_candidate": float(measured["mean_length_candidate"]),
        "differing_examples": list(measured.get("differing_examples", [])),
    }
