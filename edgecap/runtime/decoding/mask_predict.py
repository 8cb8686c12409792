"""Mask-predict-update decoding (LaBERT §3.2, Eq. 5–7), driven through a small :class:`RefineModel` adapter.

The loop lives here, not in a model, so one implementation runs on torch and on ONNX Runtime (and later TensorRT):
the backend only runs one ``refine`` pass per step.

For length level l with range ``[L_low, L_high]``, T refinement steps and EOS decay γ:

1. ``S`` = ``[MASK] × L_high``; one ``refine`` pass; every position takes its argmax ``s_i`` (Eq. 6) with confidence
   ``c_i = max_s p_i(s)`` — after ``p_i(EOS) ← γ^(L_high − i) p_i(EOS)`` for 1-based ``i ∈ [L_low, L_high]`` (Eq. 5).
2. For t = 2..T: re-mask the ``n_t = max(1, ⌊L_high · (T − t) / T⌋)`` positions of lowest confidence (ties: the
   leftmost first), run ``refine``, write the new argmax at the masked positions only, and update confidences with
   the **global** rule (Eq. 7: masked ``c_i ← c'_i``, others ``c_i ← (c_i + c'_i) / 2`` with ``c'_i`` the new max
   probability) or the **original** mask-predict rule (Ghazvininejad et al. 2019: only masked positions change).
3. The caption is ``S`` cut before its first EOS (no EOS: all ``L_high`` words, ``finished=False``).

Deviations, documented: the paper's ``n_t`` is 0 at t = T (a pass that changes nothing); like the official code we
re-mask at least one position, so each of the T passes can change the caption. The decay uses the paper's exponent
``L_high − i`` (the code's is one higher). PAD, BOS and ``forbid_tokens`` are never predicted (the official code
drops leftover special tokens when detokenising instead). Probabilities are not renormalised after the decay
(argmax only, as in the code).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from edgecap.runtime.decoding.arrays import to_numpy
from edgecap.runtime.decoding.config import DecodeCfg, DecodeCfgError
from edgecap.runtime.decoding.protocol import DecodeInputError, Hypothesis, State, batch_size_of
from edgecap.runtime.decoding.update_rules import CONFIDENCE_UPDATES, UPDATE_RULES

__all__ = ["UPDATE_RULES", "RefineModel", "eos_decay_bias", "mask_counts", "mask_predict"]


@runtime_checkable
class RefineModel(Protocol):
    """What mask-predict needs from a non-autoregressive captioner, on any backend.

    Attributes:
        length_levels: ``((L_low, L_high), ...)`` per level; levels are 1-based.
        refine_steps: default T per level.
        eos_decay: default γ per level.
        mask_id: the ``[MASK]`` input id.
    """

    length_levels: tuple[tuple[int, int], ...]
    refine_steps: tuple[int, ...]
    eos_decay: tuple[float, ...]
    mask_id: int

    def encode(self, inputs: Mapping[str, Any]) -> State:
        """Visual inputs (``features``, ``boxes``, ``feature_mask``; numpy or torch) -> state with the batch on axis
        0, in the adapter's own arrays."""
        ...

    def refine(self, tokens: np.ndarray, length_level: np.ndarray, state: State) -> Any:
        """``tokens`` (B, L) int64, ``length_level`` (B,) int64 numpy arrays -> log-probs (B, L, V), any array
        :func:`~edgecap.runtime.decoding.arrays.to_numpy` reads (read as float32)."""
        ...


def mask_counts(length: int, steps: int) -> list[int]:
    """Positions re-masked at steps t = 2..T: ``max(1, ⌊L · (T − t) / T⌋)`` (linear decay, §3.2)."""
    return [max(1, (length * (steps - t)) // steps) for t in range(2, steps + 1)]


def eos_decay_bias(low: int, high: int, gamma: float) -> np.ndarray:
    """(L_high,) additive log-prob bias of EOS: ``(L_high − i) · log γ`` for 1-based ``i ∈ [L_low, L_high]`` (Eq. 5)."""
    bias = np.zeros(high, dtype=np.float32)
    if gamma < 1.0:
        for i in range(low, high + 1):
            bias[i - 1] = (high - i) * math.log(gamma)
    return bias


def _resolve(model: RefineModel, cfg: DecodeCfg) -> tuple[int, int, int, int, float]:
    levels = tuple(model.length_levels)
    level = cfg.length_level
    if level is None:
        raise DecodeCfgError(f"mask-predict needs a length_level in 1..{len(levels)} (levels: {list(levels)})")
    if not 1 <= level <= len(levels):
        ranges = ", ".join(f"{i + 1}: {lo}-{hi}" for i, (lo, hi) in enumerate(levels))
        raise DecodeCfgError(f"length_level must be in 1..{len(levels)} ({ranges} words), got {level}")
    low, high = levels[level - 1]
    steps = cfg.refine_steps if cfg.refine_steps is not None else int(model.refine_steps[level - 1])
    gamma = cfg.eos_decay if cfg.eos_decay is not None else float(model.eos_decay[level - 1])
    return level, low, high, steps, gamma


def mask_predict(
    model: RefineModel, inputs: Mapping[str, Any], cfg: DecodeCfg, processors: Any = None
) -> list[list[Hypothesis]]:
    """Decode a batch by mask-predict-update at ``cfg.length_level`` (see the module docstring).

    Args:
        model: a :class:`RefineModel` (``TorchRefineModel``, ``RuntimeRefineModel``).
        inputs: encoder inputs with batch B.
        cfg: ``length_level`` (required), ``refine_steps`` / ``eos_decay`` (None: the model's per-level
            defaults), ``update_rule``, token ids and ``forbid_tokens``.
        processors: not supported (autoregressive processors have no meaning here); must be None.

    Returns:
        B lists of one :class:`Hypothesis`: tokens before the first EOS; ``logprobs`` are each kept token's
        log-prob when it was last predicted (then EOS's); ``score`` their sum.
    """
    if processors:
        raise DecodeCfgError("mask-predict does not take autoregressive logits processors")
    if cfg.update_rule not in UPDATE_RULES:
        raise DecodeCfgError(f"update_rule must be one of {UPDATE_RULES}, got {cfg.update_rule!r}")
    update = CONFIDENCE_UPDATES[cfg.update_rule]
    level, low, high, steps, gamma = _resolve(model, cfg)
    state = model.encode(inputs)
    batch = batch_size_of(state)
    mask_id = int(model.mask_id)
    levels = np.full(batch, level, dtype=np.int64)
    eos_bias = eos_decay_bias(low, high, gamma)
    forbid = sorted({cfg.pad_id, cfg.bos_id, *cfg.forbid_tokens})
    rows = np.arange(batch)[:, None]

    def predict(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raw = model.refine(tokens, levels, state)
        shape = tuple(getattr(raw, "shape", ()))
        if len(shape) != 3 or shape[:2] != (batch, high):
            raise DecodeInputError(f"refine() returned log-probs of shape {shape}, expected ({batch}, {high}, V)")
        scores = np.array(to_numpy(raw, np.float32), dtype=np.float32, copy=True)  # written below: never the buffer
        if cfg.eos_id >= scores.shape[-1]:
            raise DecodeInputError(f"eos_id {cfg.eos_id} is outside the model's {scores.shape[-1]} classes")
        scores[..., forbid] = -math.inf
        scores[..., cfg.eos_id] += eos_bias
        token = scores.argmax(axis=-1)  # the first maximum, as torch's max(dim) on CPU
        best = np.take_along_axis(scores, token[..., None], axis=-1)[..., 0]
        return token, np.exp(best), best

    tokens = np.full((batch, high), mask_id, dtype=np.int64)
    tokens, confidence, token_lp = predict(tokens)
    for count in mask_counts(high, steps):
        lowest = np.argsort(confidence, axis=1, kind="stable")[:, :count]
        masked = np.zeros((batch, high), dtype=bool)
        masked[rows, lowest] = True
        new_token, new_conf, new_lp = predict(np.where(masked, mask_id, tokens))
        tokens = np.where(masked, new_token, tokens)
        token_lp = np.where(masked, new_lp, token_lp)
        confidence = update(confidence, new_conf, masked)
    return [[_hypothesis(tokens[b].tolist(), token_lp[b].tolist(), cfg.eos_id)] for b in range(batch)]


def _hypothesis(tokens: list[int], logprobs: list[float], eos_id: int) -> Hypothesis:
    end = tokens.index(eos_id) if eos_id in tokens else len(tokens)
    finished = end < len(tokens)
    kept = logprobs[: end + 1] if finished else logprobs[:end]
    return Hypothesis(tokens=tokens[:end], score=float(sum(kept)), logprobs=kept, finished=finished)
