""":class:`~edgecap.runtime.decoding.mask_predict.RefineModel` adapters: LaBERT's ``encode`` + ``refine`` on torch and
on any
graph :class:`~edgecap.runtime.backends.base.Runtime` (ONNX Runtime now, TensorRT later), so one mask-predict loop runs
everywhere — the non-autoregressive counterpart of ``TorchStepModel`` / ``RuntimeStepModel``.

Graph contract (``edgecap.workshop.export.specs.labert``): ``encoder`` (visual inputs -> ``visual``, ``visual_bias``)
and ``refine`` (``tokens`` (B, L) int64, ``length_level`` (B,) int64, the state -> ``logprobs`` (B, L, V)). The length
levels, default T and γ per level and the ``[MASK]`` id travel in the graphs' metadata.

The mask-predict loop hands both adapters int64 numpy tokens and levels and reads numpy log-probs back. The torch
adapter is the workshop half's (:mod:`edgecap.workshop.torch_runtime.refine`), the ONNX Runtime constructor
:mod:`edgecap.runtime.backends.onnxruntime.refine`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgecap.runtime.backends.base import Array, Runtime, RuntimeInputError
from edgecap.runtime.backends.bridge import GraphPair
from edgecap.runtime.decoding.protocol import DecodeInputError, State

#: The visual inputs of a refine model's encoder (as ``edgecap.workshop.torch_runtime.runtime.CAPTION_INPUTS``).
CAPTION_INPUTS = ("features", "boxes", "feature_mask")

__all__ = ["CAPTION_INPUTS", "RuntimeRefineModel"]


class RuntimeRefineModel(GraphPair):
    """A :class:`RefineModel` over an encoder runtime and a refine runtime (a context manager, like
    :class:`~edgecap.runtime.backends.bridge.RuntimeStepModel`)."""

    def __init__(
        self,
        encoder: Runtime,
        refine: Runtime,
        state_names: Sequence[str],
        *,
        length_levels: Sequence[Sequence[int]],
        refine_steps: Sequence[int],
        eos_decay: Sequence[float],
        mask_id: int,
    ) -> None:
        super().__init__(encoder, refine, state_names)
        from edgecap.runtime.bundle.limits import check_length_plan  # a hostile 10^9 passes would never finish

        check_length_plan(length_levels, refine_steps, eos_decay, f"{refine.name}: length plan", RuntimeInputError)
        self.length_levels = tuple((int(lo), int(hi)) for lo, hi in length_levels)
        self.refine_steps = tuple(int(t) for t in refine_steps)
        self.eos_decay = tuple(float(g) for g in eos_decay)
        self.mask_id = int(mask_id)

    @property
    def refine_runtime(self) -> Runtime:
        """The refine runtime."""
        return self.loop_runtime

    def encode(self, inputs: Mapping[str, Any]) -> State:
        return self.run_encoder(inputs)

    def refine(self, tokens: np.ndarray, length_level: np.ndarray, state: State) -> np.ndarray:
        """tokens (B, L), length_level (B,) int64 numpy -> (B, L, V) float32 numpy log-probs."""
        meta = self.refine_runtime.input_metadata()
        feed: dict[str, Array] = {
            "tokens": self._loop_ops.feed(tokens, meta["tokens"].dtype),
            "length_level": self._loop_ops.feed(length_level, meta["length_level"].dtype),
        }
        feed.update((n, state[n]) for n in self.state_names)
        outputs = self.refine_runtime.infer(feed)
        if "logprobs" not in outputs:
            raise DecodeInputError(f"{self.refine_runtime.name}: outputs lack 'logprobs' (got {sorted(outputs)})")
        return self._loop_ops.logprobs(outputs["logprobs"])
