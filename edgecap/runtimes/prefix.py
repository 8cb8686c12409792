"""``PrefixRerunStepModel``: decoding without a cache, the way the reference implementations do it.

The original ORT code (``models/CaptionModel.py``) and ExpansionNet's ``beam_search``/ONNX export keep no decoder
cache: every step feeds the whole token prefix through the decoder again (re-projecting the encoder keys/values in
every layer and computing the output projection at every position) and keeps only the last position's log-probs
(``/work/shared/reference``: ACORT/ORT notes §1.4, ExpansionNet notes §2 and §6.1). The cost of step ``t`` grows with
``t``, so a caption of T tokens costs O(T²) decoder positions against O(T) for :class:`TorchStepModel`.

This adapter reproduces that mode behind the same :class:`~edgecap.decoding.StepModel` protocol, so the one beam
search runs on it unchanged. It is the honest baseline for the cached-decoding benchmark
(``benchmarks/decode_cache.py``) and an independent parity check of the cache: ``CaptionModel.decode_full`` and
``CaptionModel.step`` compute the same function, so both adapters must decode the same tokens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from edgecap.decoding.protocol import DecodeInputError, State
from edgecap.runtimes.torch import CAPTION_INPUTS, resolve_device

__all__ = ["PREFIX_STATE", "PrefixRerunStepModel"]

#: State entries, all batch-first: encoder output (B, N, d), region mask (B, N) bool, tokens fed so far (B, t) long.
PREFIX_STATE = ("memory", "feature_mask", "prefix")


class PrefixRerunStepModel:
    """:class:`~edgecap.decoding.StepModel` that re-runs the decoder over the whole prefix at every step.

    ``encode`` runs ``model.encode_memory`` once per image; the state holds the memory, the feature mask (all True
    when none is given) and the prefix, empty at first. ``step(tokens)`` appends ``tokens`` to the prefix and returns
    ``model.decode_full(memory, mask, prefix)[:, -1]``. Takes the same inputs and options as
    :class:`~edgecap.runtimes.torch.TorchStepModel`, so the two are interchangeable in every decoding strategy.

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
        if dtype is not None and autocast is not None:
            raise ValueError("pass either dtype (cast the model) or autocast (mixed precision), not both")
        self.device = resolve_device(device)
        self.dtype, self.autocast_dtype = dtype, autocast
        self.model = model.to(self.device) if dtype is None else model.to(self.device, dtype)
        self.model.eval()

    @contextlib.contextmanager
    def _context(self) -> Iterator[None]:
        with torch.inference_mode():
            if self.autocast_dtype is None:
                yield
            else:
                with torch.autocast(self.device.type, dtype=self.autocast_dtype):
                    yield

    def _prepare(self, value: Any) -> Tensor:
        tensor = value if isinstance(value, Tensor) else torch.as_tensor(value)
        if self.dtype is not None and tensor.is_floating_point():
            return tensor.to(self.device, self.dtype, non_blocking=True)
        return tensor.to(self.device, non_blocking=True)

    def encode(self, inputs: Mapping[str, Tensor]) -> State:
        """inputs: ``features`` (B, N, C), ``boxes`` (B, N, 4), optional ``feature_mask`` (B, N) bool.

        Returns:
            ``memory`` (B, N, d), ``feature_mask`` (B, N) bool and an empty ``prefix`` (B, 0) long.
        """
        missing = [n for n in CAPTION_INPUTS[:2] if n not in inputs]
        unknown = [n for n in inputs if n not in CAPTION_INPUTS]
        if missing or unknown:
            raise DecodeInputError(
                f"PrefixRerunStepModel.encode: inputs need {list(CAPTION_INPUTS[:2])} (+ optional 'feature_mask'); "
                f"missing {missing}, unknown {unknown}"
            )
        features, boxes = (self._prepare(inputs[n]) for n in CAPTION_INPUTS[:2])
        mask = inputs.get("feature_mask")
        mask = None if mask is None else self._prepare(mask)
        with self._context():
            memory = self.model.encode_memory(features, boxes, mask)
        if mask is None:
            # The state needs a tensor; an all-valid mask gives decode_full the same zero attention bias as None.
            mask = torch.ones(memory.shape[:2], dtype=torch.bool, device=memory.device)
        prefix = torch.empty(memory.shape[0], 0, dtype=torch.long, device=memory.device)
        return {"memory": memory, "feature_mask": mask, "prefix": prefix}

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """Append ``tokens`` (B,) to the prefix (B, t) and decode all t + 1 positions; log-probs (B, V) of the last."""
        absent = [n for n in PREFIX_STATE if n not in state]
        if absent:
            raise DecodeInputError(
                f"PrefixRerunStepModel.step: state lacks {absent}; pass the state returned by encode/step/select"
            )
        with self._context():
            prefix = torch.cat([state["prefix"], tokens.to(self.device, torch.long)[:, None]], dim=1)
            logprobs = self.model.decode_full(state["memory"], state["feature_mask"], prefix)[:, -1]
        return logprobs.float(), {**state, "prefix": prefix}

    def select(self, state: State, index: Tensor) -> State:
        """Gather rows of every state entry along axis 0 (beam expansion, reordering and pruning)."""
        with torch.inference_mode():
            index = index.to(self.device)
            return {name: value.index_select(0, index) for name, value in state.items()}
