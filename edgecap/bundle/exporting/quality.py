"""The task-level check: CIDEr-D and caption agreement of each variant on ONNX Runtime (CPU) against the torch FP32
model, on the held-out set (``edgecap.calibration.compare_decoders``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from edgecap.bundle.exporting.held_out import HeldOut
from edgecap.bundle.exporting.images import EncoderInputs

__all__ = ["PixelReference", "fp32_references", "task_check", "torch_batches"]


class PixelReference:
    """The torch FP32 reference of a bundle whose encoder graph contains the backbone: ``pixel_values`` through the
    torch backbone, then the captioner's own decoder adapter (a :class:`~edgecap.decoding.StepModel`, or LaBERT's
    refine model), to which everything but ``encode`` is handed on."""

    def __init__(self, backbone: torch.nn.Module, inner: Any) -> None:
        self.backbone, self.inner = backbone.eval(), inner

    def encode(self, inputs: Mapping[str, torch.Tensor]) -> Any:
        with torch.inference_mode():
            features, boxes = self.backbone(torch.as_tensor(inputs["pixel_values"]))
        return self.inner.encode({"features": features, "boxes": boxes})

    def __getattr__(self, name: str) -> Any:
        if name in ("backbone", "inner"):  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def torch_batches(images: EncoderInputs) -> list[dict[str, torch.Tensor]]:
    return [{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()} for batch in images.batches]


def fp32_references(reference: Any, batches: Sequence[Mapping[str, torch.Tensor]], vocab: Any, cfg: Any) -> list:
    from edgecap.captioning import captions_from_hypotheses
    from edgecap.decoding import decode

    out: list[list[str]] = []
    for batch in batches:
        out.extend([c] for c in captions_from_hypotheses(vocab, decode(reference, batch, cfg)))
    return out


def task_check(
    reference: Any,
    models: Mapping[str, Any],
    spec: Any,
    held_out: HeldOut,
    references: list[list[str]],
    vocab: Any,
    cfg: Any,
) -> dict[str, Any]:
    """CIDEr-D of the torch FP32 reference and of ``models`` on ONNX Runtime (CPU), their difference, agreement."""
    from edgecap.calibration import compare_decoders
    from edgecap.runtimes.decoders import create_ort_decoder
    from edgecap.runtimes.threads import plan_threads

    batches = torch_batches(held_out.inputs)
    threads = plan_threads("auto").runtime_options()  # as Captioner.load: no spinning next to torch's threads
    with create_ort_decoder(
        models, spec.state_names, updated_state_names=spec.step_state_names, providers=("cpu",), **threads
    ) as candidate:
        measured = compare_decoders(reference, candidate, batches, references, vocab, cfg)
    return {
        "set": held_out.description,
        "images": len(held_out.inputs),
        "references": "human captions" if held_out.references is not None else "torch FP32 captions",
        "reference": "torch FP32",
        "beam": cfg.beam_size if cfg.strategy == "beam" else 1,
        "decoding": cfg.strategy,
        "length_level": cfg.length_level,
        **_quality_fields(measured),
    }


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
