"""``PrefixRerunStepModel``: decoding without a cache, the way the reference implementations do it.

The original ORT code (``models/CaptionModel.py``) and ExpansionNet's ``beam_search``/ONNX export keep no decoder
cache: every step feeds the whole token prefix through the decoder again (re-projecting the encoder keys/values in
every layer and computing the output projection at every position) and keeps only the last position's log-probs
(yahoo/object_relation_transformer; jchenghu/ExpansionNet_v2 ``models/captioning_model.py``, ``onnx4tensorrt/``).
The cost of step ``t`` grows with ``t``, so a caption of T tokens costs O(T²) decoder positions against O(T) for
:class:`TorchStepModel`.

This adapter reproduces that mode behind the same :class:`~edgecap.runtime.decoding.StepModel` protocol, so the one beam
search runs on it unchanged. It is the honest baseline for the cached-decoding benchmark
(``research/decode_cache.py``) and an independent parity check of the cache: ``CaptionModel.decode_full`` and
``CaptionModel.step`` compute the same function, so both adapters must decode the same tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from edgecap.runtime.decoding.protocol import DecodeInputError, State
from edgecap.workshop.torch_runtime.runtime import LENGTH_LEVEL_INPUT, TorchStepModel, host_float32

__all__ = ["PREFIX_STATE", "PrefixRerunModel", "PrefixRerunStepModel", "rerun_step"]

#: State entries, all batch-first: encoder output (B, N, d), region mask (B, N) bool, tokens fed so far (B, t) long.
#: A length-controllable model's state also holds ``length_level`` (B,) long, each hypothesis' 1-based level.
PREFIX_STATE = ("memory", "feature_mask", "prefix")


def rerun_step(
    model: nn.Module,
    memory: Tensor,
    feature_mask: Tensor,
    prefix: Tensor,
    tokens: Tensor,
    length_level: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The reference's decoder step: append ``tokens`` (B,) to ``prefix`` (B, t), run the decoder over all t + 1
    positions (at ``length_level`` (B,) for a length-controllable model), keep the last position's log-probs.
    Returns ``(logprobs (B, V), the grown prefix)``."""
    prefix = torch.cat([prefix, tokens.to(prefix.device, torch.long)[:, None]], dim=1)
    extra = {} if length_level is None else {"length_level": length_level}
    return model.decode_full(memory, feature_mask, prefix, **extra)[:, -1], prefix


class PrefixRerunModel(nn.Module):
    """A captioner seen as a "cached-step" model whose only cache is the token prefix: the reference decoding in the
    ``CaptionModel`` step interface, so that the regular export (``get_export_spec`` of the wrapped model's family)
    turns it into encoder/start/step ONNX graphs that re-run the prefix every step, like the official ExpansionNet
    export. ``research/decode_cache.py --runtime onnxruntime`` times those graphs against the cached step graphs on
    ONNX Runtime with the same beam search, so both sides of the comparison run in the same low-overhead runtime.

    State: ``rerun_memory`` (B, N, d), ``rerun_mask`` (B, N) bool, ``prefix`` (B, t) long (names differ from the
    start graph's ``memory``/``feature_mask`` inputs, as graph inputs and outputs cannot share names), and for a
    length-controllable model ``rerun_level`` (B,) long, the level every step passes to ``decode_full``.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.cfg = model.cfg
        self.vocab_size, self.feature_dim = model.vocab_size, model.feature_dim
        self.length_levels = getattr(model, "length_levels", None)

    @property
    def state_names(self) -> tuple[str, ...]:
        base = ("rerun_memory", "rerun_mask", "prefix")
        return (*base, "rerun_level") if self.length_levels else base

    @property
    def max_len(self) -> int:
        return int(self.model.max_len)

    def encode_memory(self, features: Tensor, boxes: Tensor, feature_mask: Tensor | None = None) -> Tensor:
        return self.model.encode_memory(features, boxes, feature_mask)

    def start(self, memory: Tensor, feature_mask: Tensor | None = None, length_level: Tensor | None = None) -> State:
        if feature_mask is None:
            feature_mask = torch.ones(memory.shape[:2], dtype=torch.bool, device=memory.device)
        prefix = torch.zeros(memory.shape[0], 0, dtype=torch.long, device=memory.device)
        state = {"rerun_memory": memory, "rerun_mask": feature_mask, "prefix": prefix}
        # Checked as the wrapped model's start checks it: required and in range with levels, refused without.
        level = self.model._level_kwargs(length_level, memory).get("length_level")
        if level is not None:
            state["rerun_level"] = level
        return state

    def encode(
        self,
        features: Tensor,
        boxes: Tensor,
        feature_mask: Tensor | None = None,
        length_level: Tensor | None = None,
    ) -> State:
        return self.start(self.encode_memory(features, boxes, feature_mask), feature_mask, length_level)

    def step(self, tokens: Tensor, state: Mapping[str, Tensor]) -> tuple[Tensor, State]:
        logprobs, prefix = rerun_step(
            self.model,
            state["rerun_memory"],
            state["rerun_mask"],
            state["prefix"],
            tokens,
            state.get("rerun_level"),
        )
        return logprobs, {**state, "prefix": prefix}


class PrefixRerunStepModel(TorchStepModel):
    """:class:`~edgecap.runtime.decoding.StepModel` that re-runs the decoder over the whole prefix at every step.

    ``encode`` runs ``model.encode_memory`` once per image; the state holds the memory, the feature mask (all True
    when none is given) and the prefix, empty at first. ``step(tokens)`` appends ``tokens`` to the prefix and returns
    ``model.decode_full(memory, mask, prefix)[:, -1]``. Takes the same inputs and options as
    :class:`~edgecap.workshop.torch_runtime.runtime.TorchStepModel`, so the two are interchangeable in every decoding
    strategy.

    Args:
        model: a ``CaptionModel`` (``encode_memory`` and ``decode_full``; ``docs/contracts.md``, "models").
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, …
        dtype: cast weights and floating inputs to this dtype.
        autocast: run under ``torch.autocast`` with this dtype instead (fp32 weights).

    Raises:
        TypeError: ``model`` lacks ``encode_memory`` or ``decode_full``.
        ValueError: both ``dtype`` and ``autocast`` are given, or CUDA is asked for but absent.
    """

    state_names = PREFIX_STATE

    def __init__(
        self,
        model: nn.Module,
        device: str | torch.device = "cpu",
        *,
        dtype: torch.dtype | None = None,
        autocast: torch.dtype | None = None,
    ) -> None:
        missing = [m for m in ("encode_memory", "decode_full") if not callable(getattr(model, m, None))]
        if missing:
            raise TypeError(
                f"PrefixRerunStepModel needs a CaptionModel with encode_memory() and decode_full(); "
                f"{type(model).__name__} lacks {missing}"
            )
        super().__init__(model, device, dtype=dtype, autocast=autocast)

    def encode(self, inputs: Mapping[str, Any]) -> State:
        """inputs (numpy or torch): ``features`` (B, N, C), ``boxes`` (B, N, 4), optional ``feature_mask`` (B, N)
        bool, and for a length-controllable model ``length_level`` (B,) int (LaBERT §3.1).

        Returns:
            ``memory`` (B, N, d), ``feature_mask`` (B, N) bool, an empty ``prefix`` (B, 0) long and, when given,
            ``length_level`` (B,) long, which every step passes to ``decode_full``.
        """
        features, boxes, mask = self._caption_inputs(inputs)
        with self._context():
            memory = self.model.encode_memory(features, boxes, mask)
        if mask is None:
            # The state needs a tensor; an all-valid mask gives decode_full the same zero attention bias as None.
            mask = torch.ones(memory.shape[:2], dtype=torch.bool, device=memory.device)
        prefix = torch.empty(memory.shape[0], 0, dtype=torch.long, device=memory.device)
        state = {"memory": memory, "feature_mask": mask, "prefix": prefix}
        level = inputs.get(LENGTH_LEVEL_INPUT)
        if level is not None:
            state[LENGTH_LEVEL_INPUT] = self._prepare(level).long()
        return state

    def step(self, tokens: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        """Append ``tokens`` (B,) to the prefix (B, t) and decode all t + 1 positions; log-probs (B, V) of the last,
        as float32 numpy."""
        absent = [n for n in PREFIX_STATE if n not in state]
        if absent:
            raise DecodeInputError(
                f"PrefixRerunStepModel.step: state lacks {absent}; pass the state returned by encode/step/select"
            )
        with self._context():
            logprobs, prefix = rerun_step(
                self.model,
                state["memory"],
                state["feature_mask"],
                state["prefix"],
                self._index(tokens),
                state.get(LENGTH_LEVEL_INPUT),
            )
        return host_float32(logprobs), {**state, "prefix": prefix}
