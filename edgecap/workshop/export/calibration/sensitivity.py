"""Accuracy-aware INT8: rank the quantised layers by how much captions suffer from each, then keep the fewest in
float, most sensitive first, until a quality target holds.

Post-training INT8 of a captioner loses little on average but flips early tokens on some images, and a flipped token
changes the rest of the caption; a few layers cause most of it (outlier-heavy activations, the logits projection).
NNCF's accuracy-aware quantisation and TensorRT Model Optimizer's mixed precision rank layers by the *task* metric;
this does the same with edgecap's own task metric — the captions — because neither library decodes a captioner:

1. **Rank** (:func:`rank_layers`): leave one out — every layer INT8 except that one, cut from the *already calibrated*
   QDQ graph (``layers.with_float_layers``: one calibration, never one per layer) — and decode the ranking images
   (calibration images, so the ranking is not fitted on the held-out set that is reported) with ONNX Runtime. Each
   layer's effect is the gain over the fully quantised graphs in caption agreement with the FP32 ONNX captions, then
   token agreement, then CIDEr-D against those captions (ties broken in that order).
2. **Select** (:func:`smallest_count`): the fewest top-ranked layers kept float for which ``holds(k)`` — the caller's
   check on the held-out set — is true. The search assumes the quality grows with ``k`` (monotone): it tries ``k =
   0``, then ``k = n`` (if even that fails the target cannot be met), then 1, 2, 4, … and bisects the last gap, i.e.
   ``O(log k)`` held-out checks.

:class:`Int8Target`'s CIDEr-D drop is in CIDEr-D *points* as ``edgecap`` prints them (0–100 scale, "80.6"), the
agreement a fraction of identical captions (0–1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgecap.workshop.export.calibration.layers import QuantLayer, with_float_layers

__all__ = [
    "Int8Target",
    "LayerEffect",
    "SearchResult",
    "TargetError",
    "caption_metrics",
    "models_with_float",
    "rank_layers",
    "smallest_count",
]


class TargetError(ValueError):
    """An accuracy target that cannot be a target: none given, or a value out of its range."""


@dataclass(frozen=True)
class Int8Target:
    """What the INT8 variant must hold on the held-out set, against the torch FP32 model.

    Attributes:
        max_cider_drop: at most this many CIDEr-D points (0–100 scale) below FP32; None: not checked.
        min_agreement: at least this fraction (0–1) of captions identical to FP32's; None: not checked.
    """

    max_cider_drop: float | None = None
    min_agreement: float | None = None

    def __post_init__(self) -> None:
        if self.max_cider_drop is None and self.min_agreement is None:
            raise TargetError("an INT8 accuracy target needs max_cider_drop and/or min_agreement")
        if self.max_cider_drop is not None and not 0.0 <= self.max_cider_drop <= 100.0:
            raise TargetError(f"max_cider_drop is in CIDEr-D points (0-100, e.g. 0.3), got {self.max_cider_drop}")
        if self.min_agreement is not None and not 0.0 <= self.min_agreement <= 1.0:
            raise TargetError(
                f"min_agreement is a fraction of identical captions (0-1, e.g. 0.85 for 85 %), got {self.min_agreement}"
            )

    def shortfalls(self, quality: Mapping[str, Any]) -> list[str]:
        """Why a task-level check record (``bundling.quality.task_check``) misses the target, at every length level
        it holds; empty when the target holds."""
        from edgecap.runtime.bundle.manifest import quality_levels

        out = []
        for level, fields in quality_levels(quality).items():
            at = "" if level is None or len(quality_levels(quality)) == 1 else f" at length level {level}"
            drop = 100.0 * (float(fields["reference_cider_d"]) - float(fields["candidate_cider_d"]))
            if self.max_cider_drop is not None and drop > self.max_cider_drop + 1e-9:
                out.append(f"CIDEr-D {drop:.2f} points below FP32{at} (at most {self.max_cider_drop})")
            agreement = float(fields["agreement"])
            if self.min_agreement is not None and agreement < self.min_agreement - 1e-9:
                out.append(f"{agreement:.1%} captions identical to FP32{at} (at least {self.min_agreement:.1%})")
        return out

    def record(self) -> dict[str, Any]:
        return {"max_cider_drop": self.max_cider_drop, "min_agreement": self.min_agreement}


def caption_metrics(
    reference: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]], vocab: Any
) -> dict[str, float]:
    """Agreement (identical captions), token agreement and CIDEr-D (0–1 scale) of ``candidate`` token sequences
    scored against ``reference`` ones (one reference caption per image)."""
    from edgecap.workshop.evaluation import cider_d
    from edgecap.workshop.export.calibration.quality import token_agreement

    if len(reference) != len(candidate) or not reference:
        raise ValueError(f"caption_metrics: {len(reference)} reference vs {len(candidate)} candidate captions")
    ref = [" ".join(vocab.decode(list(t))) for t in reference]
    cand = [" ".join(vocab.decode(list(t))) for t in candidate]
    return {
        "agreement": sum(a == b for a, b in zip(ref, cand, strict=True)) / len(ref),
        "token_agreement": float(
            np.mean([token_agreement(list(a), list(b)) for a, b in zip(reference, candidate, strict=True)])
        ),
        "cider_d": float(cider_d(dict(enumerate(cand)), {i: [r] for i, r in enumerate(ref)})),
    }


@dataclass(frozen=True)
class LayerEffect:
    """A layer's leave-one-out measurement: the metrics with only it in float, and their gain over full INT8."""

    layer: QuantLayer
    metrics: Mapping[str, float]
    gain: Mapping[str, float]

    def sort_key(self) -> tuple[float, float, float, str]:
        return (-self.gain["agreement"], -self.gain["token_agreement"], -self.gain["cider_d"], self.layer.key)

    def record(self) -> dict[str, Any]:
        """JSON-ready: the layer, its node count, and the gains (agreement as fractions, CIDEr-D in points)."""
        return {
            "layer": self.layer.key,
            "nodes": len(self.layer.nodes),
            "agreement_gain": round(self.gain["agreement"], 6),
            "token_agreement_gain": round(self.gain["token_agreement"], 6),
            "cider_d_gain": round(100.0 * self.gain["cider_d"], 4),
        }


def rank_layers(
    layers: Sequence[QuantLayer],
    quantized: Mapping[str, Any],
    originals: Mapping[str, Any],
    captions: Callable[[Mapping[str, Any]], list[list[int]]],
    fp32_tokens: Sequence[Sequence[int]],
    vocab: Any,
    *,
    on_layer: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, float], list[LayerEffect]]:
    """Leave-one-out sensitivity of each layer, most sensitive first, and the fully quantised graphs' metrics.

    Args:
        layers: the candidate layers (``layers.quantised_layers`` of each role).
        quantized: role -> fully quantised QDQ graph.
        originals: role -> the pre-processed FP32 graph it was quantised from (same node names).
        captions: decodes the ranking images with role -> graph models and returns their token sequences.
        fp32_tokens: the FP32 graphs' tokens on the same images (the reference of the ranking).
        vocab: turns tokens into captions.
        on_layer: called with ``(done, total)`` after each layer (progress).
    """
    base = caption_metrics(fp32_tokens, captions(quantized), vocab)
    effects = []
    for index, layer in enumerate(layers):
        models = dict(quantized)
        models[layer.role] = with_float_layers(quantized[layer.role], originals[layer.role], [layer])
        metrics = caption_metrics(fp32_tokens, captions(models), vocab)
        effects.append(LayerEffect(layer, metrics, {k: metrics[k] - base[k] for k in base}))
        if on_layer is not None:
            on_layer(index + 1, len(layers))
    return base, sorted(effects, key=LayerEffect.sort_key)


def models_with_float(
    quantized: Mapping[str, Any], originals: Mapping[str, Any], layers: Sequence[QuantLayer]
) -> dict[str, Any]:
    """role -> graph with ``layers`` in float (roles without one of them keep their quantised graph)."""
    out = dict(quantized)
    for role in {layer.role for layer in layers}:
        out[role] = with_float_layers(quantized[role], originals[role], [x for x in layers if x.role == role])
    return out


@dataclass
class SearchResult:
    """:func:`smallest_count`'s answer: ``count`` (None when even ``n`` fails) and each tried count's outcome."""

    count: int | None
    tried: dict[int, bool]


def smallest_count(n: int, holds: Callable[[int], bool]) -> SearchResult:
    """The smallest ``k`` in ``0..n`` with ``holds(k)``, assuming ``holds`` is monotone (false ... false, true ...).

    Tries 0, then n, then 1, 2, 4, ... (galloping) and bisects the gap where it turns true: few calls when few layers
    are needed, ``O(log n)`` in any case. Each ``k`` is evaluated at most once."""
    if n < 0:
        raise ValueError(f"smallest_count: n must be >= 0, got {n}")
    tried: dict[int, bool] = {}

    def check(k: int) -> bool:
        if k not in tried:
            tried[k] = bool(holds(k))
        return tried[k]

    if check(0):
        return SearchResult(0, tried)
    if n == 0 or not check(n):
        return SearchResult(None, tried)
    low, high = 0, n  # holds(low) is false, holds(high) is true
    step = 1
    while step < high and not check(step):
        low, step = step, step * 2
    if step < high:  # the loop stopped on a count that holds
        high = step
    while high - low > 1:
        middle = (low + high) // 2
        if check(middle):
            high = middle
        else:
            low = middle
    return SearchResult(high, tried)
