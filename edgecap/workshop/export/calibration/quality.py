"""Task-level comparison of two decoders (e.g. INT8 against its FP32 reference) on the same images.

Tensor errors say little about a quantised captioner: a logit error that never flips a beam's choice costs nothing,
one that flips an early token changes the whole caption. So where FP32 and FP16 graphs are held to element-wise
tolerances, the INT8 check compares what users see — the captions: the share of identical captions, position-wise
token agreement and, with references, the CIDEr-D of both (Vedantam et al. 2015, CIDEr-D;
``edgecap.workshop.evaluation.cider_d``) and its delta. Bundles record it per variant (the task-level check,
``docs/contracts.md``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from edgecap.runtime.decoding import DecodeCfg, decode
from edgecap.runtime.decoding.protocol import StepModel

__all__ = ["QualityInputError", "compare_decoders", "token_agreement"]


class QualityInputError(ValueError):
    """Inputs to a decoder comparison that cannot be compared: no images, or references not matching them."""


def token_agreement(a: Sequence[int], b: Sequence[int]) -> float:
    """Share of positions holding the same token, over the longer sequence (1.0 for two empty sequences).

    Position-wise, not an edit distance: once a decoder takes another token, what follows is conditioned on a
    different prefix, and counting it as agreement would flatter the candidate.
    """
    longest = max(len(a), len(b))
    if longest == 0:
        return 1.0
    return sum(1 for x, y in zip(a, b, strict=False) if x == y) / longest


def compare_decoders(
    reference_step_model: StepModel,
    candidate_step_model: StepModel,
    inputs_batches: Iterable[Mapping[str, Any]],
    references: Sequence[Sequence[str]] | None,
    vocab: Any,
    decode_cfg: DecodeCfg,
) -> dict[str, Any]:
    """Decode the same images with two step models and compare the captions.

    Args:
        reference_step_model: the reference (e.g. FP32 ONNX Runtime or torch), ready to decode.
        candidate_step_model: the model under test (e.g. INT8), ready to decode.
        inputs_batches: decode-input batches (encoder feeds), numpy or torch.
        references: per image, in batch order, its reference captions (strings); None skips CIDEr-D.
        vocab: the vocabulary (``decode(ids) -> words``).
        decode_cfg: decoding configuration used for both.

    Returns:
        ``{"images", "caption_agreement_pct", "token_agreement_pct", "mean_length_reference",
        "mean_length_candidate", "differing_examples"}`` plus, with references, ``"cider_d_reference"``,
        ``"cider_d_candidate"`` and ``"cider_d_delta"`` (candidate − reference, CIDEr-D on the pycocoevalcap
        scale; the document frequencies come from the references, so score a whole set, not one image).

    Raises:
        QualityInputError: no images, or ``references`` not one entry per image.
    """
    ref_tokens: list[list[int]] = []
    cand_tokens: list[list[int]] = []
    for batch in inputs_batches:
        inputs = dict(batch)  # numpy or torch: the step models' adapters convert
        ref_tokens.extend(h[0].tokens for h in decode(reference_step_model, inputs, decode_cfg))
        cand_tokens.extend(h[0].tokens for h in decode(candidate_step_model, inputs, decode_cfg))
    images = len(ref_tokens)
    if images == 0:
        raise QualityInputError("compare_decoders: inputs_batches yielded no images")
    ref_caps = [" ".join(vocab.decode(t)) for t in ref_tokens]
    cand_caps = [" ".join(vocab.decode(t)) for t in cand_tokens]
    same = sum(1 for a, b in zip(ref_caps, cand_caps, strict=True) if a == b)
    report: dict[str, Any] = {
        "images": images,
        "caption_agreement_pct": 100.0 * same / images,
        "token_agreement_pct": 100.0
        * float(np.mean([token_agreement(a, b) for a, b in zip(ref_tokens, cand_tokens, strict=True)])),
        "mean_length_reference": float(np.mean([len(c.split()) for c in ref_caps])),
        "mean_length_candidate": float(np.mean([len(c.split()) for c in cand_caps])),
        "differing_examples": [
            {"image": i, "reference": a, "candidate": b}
            for i, (a, b) in enumerate(zip(ref_caps, cand_caps, strict=True))
            if a != b
        ][:5],
    }
    if references is not None:
        if len(references) != images:
            raise QualityInputError(
                f"compare_decoders: {len(references)} reference entries for {images} images (one list per image)"
            )
        from edgecap.workshop.evaluation import cider_d

        if any(isinstance(r, str) for r in references):
            raise QualityInputError("compare_decoders: references must hold a list of captions per image, got a str")
        refs = {i: list(r) for i, r in enumerate(references)}
        reference_score = cider_d(dict(enumerate(ref_caps)), refs)
        candidate_score = cider_d(dict(enumerate(cand_caps)), refs)
        report.update(
            cider_d_reference=reference_score,
            cider_d_candidate=candidate_score,
            cider_d_delta=candidate_score - reference_score,
        )
    return report
