"""The step interface every decoder strategy is written against, and what a strategy returns.

Decoding follows fairseq's split of a model into ``encode`` / incremental ``step`` / state reordering: the search
never sees a model class or a backend, only a :class:`StepModel`. Torch models, ONNX Runtime sessions and TensorRT
engines all reach the one beam search through this protocol (``edgecap.runtimes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

#: A decoder state: named arrays, every one with the batch (hypotheses) on axis 0. Runtime adapters may hold
#: non-torch arrays (e.g. numpy for ONNX Runtime); the search only passes a state back to the model that made it.
State = dict[str, Any]


class DecodeInputError(ValueError):
    """A step model or its inputs broke the decoding contract (shapes, batch axis, missing entries)."""


@runtime_checkable
class StepModel(Protocol):
    """What a decoding strategy needs from a captioner, on any backend.

    Token ids (BOS/EOS/PAD) are not part of this interface: they come from the :class:`~edgecap.decoding.DecodeCfg`.
    """

    def encode(self, inputs: Mapping[str, Tensor]) -> State:
        """Run the encoder once per image.

        Args:
            inputs: model inputs, e.g. ``features`` (B, N, C), ``boxes`` (B, N, 4), ``feature_mask`` (B, N).

        Returns:
            The initial decoder state; every entry has B on axis 0.
        """
        ...

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """Advance every hypothesis by one token.

        Args:
            tokens: (B,) long, the previous token of each hypothesis (BOS at the first step).
            state: the state returned by :meth:`encode`, :meth:`step` or :meth:`select`, batch B.

        Returns:
            log-probabilities (B, V) float32 for the next token, and the state after consuming ``tokens``.
        """
        ...

    def select(self, state: State, index: Tensor) -> State:
        """Gather rows of ``state`` along axis 0.

        Used both to expand B images to B·K beams (``index`` = ``arange(B).repeat_interleave(K)``) and to reorder or
        prune beams. The searches skip the call when the gather would be the identity (every row continues itself,
        in order), so ``step`` must accept the state it returned itself, as greedy decoding always feeds it.

        Args:
            state: batch B.
            index: (B',) long, values in ``[0, B)``; may repeat rows.

        Returns:
            The state with batch B'.
        """
        ...


@dataclass
class Hypothesis:
    """One decoded sequence.

    Attributes:
        tokens: generated token ids, without BOS and without EOS.
        score: the ranking score. For beam search the sum of token log-probs after the length penalty (if any);
            for greedy and sampling the plain sum of token log-probs.
        logprobs: per-token log-probs of ``tokens`` followed by the EOS log-prob when ``finished``; their sum is the
            unpenalised sequence log-probability.
        finished: True when the sequence ended with EOS, False when it was cut at ``max_len``.
    """

    tokens: list[int]
    score: float
    logprobs: list[float] | None = field(default=None, compare=False)
    finished: bool = True

    @property
    def logprob(self) -> float:
        """Sum of the per-token log-probs (the score before any length penalty)."""
        if self.logprobs is None:
            raise ValueError("this hypothesis was built without per-token log-probs")
        return float(sum(self.logprobs))

    def __len__(self) -> int:
        return len(self.tokens)


def batch_size_of(state: State) -> int:
    """The common axis-0 size of every entry of ``state``; a clear error when entries disagree."""
    if not state:
        raise DecodeInputError("the step model returned an empty state; it must hold at least one array")
    sizes = {}
    for name, value in state.items():
        shape = getattr(value, "shape", None)
        if shape is None or len(shape) == 0:
            raise DecodeInputError(f"state entry {name!r} is not an array with a batch axis (got {type(value)!r})")
        sizes[name] = int(shape[0])
    if len(set(sizes.values())) != 1:
        raise DecodeInputError(f"state entries disagree on the batch size (axis 0): {sizes}")
    return next(iter(sizes.values()))


def device_of(state: State) -> torch.device:
    """Device of the first torch tensor in ``state`` (CPU when the state holds no torch tensors)."""
    for value in state.values():
        if isinstance(value, Tensor):
            return value.device
    return torch.device("cpu")


def validate_logprobs(logprobs: Any, rows: int, device: torch.device | None = None) -> Tensor:
    """Validate a step's output — a (rows, V) tensor — and move it to ``device``; no copy, no dtype change.

    The search loops use this and leave the one copy to :class:`~edgecap.decoding.processors.ProcessorPlan`, which
    makes it while masking (it never writes into the backend's buffer).
    """
    if not isinstance(logprobs, Tensor):
        raise DecodeInputError(f"step() must return a torch.Tensor of log-probs, got {type(logprobs)!r}")
    if logprobs.dim() != 2 or logprobs.shape[0] != rows:
        raise DecodeInputError(f"step() returned log-probs of shape {tuple(logprobs.shape)}, expected ({rows}, V)")
    if device is not None and logprobs.device != device:
        logprobs = logprobs.to(device)
    return logprobs


def stack_hypotheses(
    hypotheses: list[Hypothesis], pad_id: int, eos_id: int | None = None, max_len: int | None = None
) -> tuple[Tensor, Tensor]:
    """Right-pad hypotheses into one tensor, e.g. to re-score samples with teacher forcing (SCST).

    Args:
        hypotheses: N hypotheses.
        pad_id: fill value.
        eos_id: when given, EOS is appended to finished hypotheses (it is a scored token in SCST's loss).
        max_len: width of the result; default the longest sequence.

    Returns:
        tokens (N, T) long and lengths (N,) long (counting the appended EOS).
    """
    rows = [h.tokens + ([eos_id] if eos_id is not None and h.finished else []) for h in hypotheses]
    width = max((len(r) for r in rows), default=0) if max_len is None else max_len
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    lengths = torch.zeros(len(rows), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"hypothesis {i} has {len(row)} tokens, more than max_len={width}")
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        lengths[i] = len(row)
    return out, lengths
