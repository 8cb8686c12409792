"""The step interface every decoder strategy is written against, and what a strategy returns.

Decoding follows fairseq's split of a model into ``encode`` / incremental ``step`` / state reordering: the search
never sees a model class or a backend, only a :class:`StepModel`. Torch models, ONNX Runtime sessions and TensorRT
engines all reach the one beam search through this protocol (``edgecap.runtime.backends``).

The search runs on numpy (``docs/contracts.md``, "StepModel"): it hands the model int64 numpy tokens and row indices,
and converts the log-probs it gets back with :func:`~edgecap.runtime.decoding.arrays.to_numpy`, so a step model may
return
numpy, torch or cupy arrays. The state is opaque to the search and stays in the adapter's own arrays (torch tensors
on a GPU, numpy for ONNX Runtime on CPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from edgecap.runtime.decoding.arrays import to_numpy

#: A decoder state: named arrays, every one with the batch (hypotheses) on axis 0, in the adapter's own array type
#: (numpy for ONNX Runtime, torch tensors for torch models); the search only passes a state back to the model that
#: made it.
State = dict[str, Any]


class DecodeInputError(ValueError):
    """A step model or its inputs broke the decoding contract (shapes, batch axis, missing entries)."""


@runtime_checkable
class StepModel(Protocol):
    """What a decoding strategy needs from a captioner, on any backend.

    Token ids (BOS/EOS/PAD) are not part of this interface: they come from the
    :class:`~edgecap.runtime.decoding.DecodeCfg`.
    """

    def encode(self, inputs: Mapping[str, Any]) -> State:
        """Run the encoder once per image.

        Args:
            inputs: model inputs, e.g. ``features`` (B, N, C), ``boxes`` (B, N, 4), ``feature_mask`` (B, N); numpy
                arrays (what ``Captioner`` passes) or torch tensors (training/eval code): the adapter converts.

        Returns:
            The initial decoder state; every entry has B on axis 0.
        """
        ...

    def step(self, tokens: np.ndarray, state: State) -> tuple[Any, State]:
        """Advance every hypothesis by one token.

        Args:
            tokens: (B,) int64 numpy array, the previous token of each hypothesis (BOS at the first step).
            state: the state returned by :meth:`encode`, :meth:`step` or :meth:`select`, batch B.

        Returns:
            log-probabilities (B, V) for the next token — any array :func:`~edgecap.runtime.decoding.arrays.to_numpy`
            reads
            (numpy, torch, cupy; read as float32, never written into) — and the state after consuming ``tokens``.
        """
        ...

    def select(self, state: State, index: np.ndarray) -> State:
        """Gather rows of ``state`` along axis 0.

        Used both to expand B images to B·K beams (``index`` = ``arange(B).repeat_interleave(K)``) and to reorder or
        prune beams. The searches skip the call when the gather would be the identity (every row continues itself,
        in order), so ``step`` must accept the state it returned itself, as greedy decoding always feeds it.

        Args:
            state: batch B.
            index: (B',) int64 numpy array, values in ``[0, B)``; may repeat rows. Adapters convert it to their own
                arrays (torch: ``torch.from_numpy(index).to(device)``).

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


def as_logprobs(logprobs: Any, rows: int) -> np.ndarray:
    """A step's output as (rows, V) float32 numpy log-probs: one conversion per step, no copy when it is one already.

    The result may be the backend's own buffer (a zero-copy view of an ONNX Runtime output or a CPU torch tensor);
    :class:`~edgecap.runtime.decoding.processors.ProcessorPlan` makes the one copy the search needs while masking.
    """
    try:
        out = to_numpy(logprobs, np.float32)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise DecodeInputError(f"step() must return an array of log-probs, got {type(logprobs)!r}: {exc}") from None
    if out.ndim != 2 or out.shape[0] != rows:
        raise DecodeInputError(f"step() returned log-probs of shape {tuple(out.shape)}, expected ({rows}, V)")
    return out


def stack_hypotheses(
    hypotheses: list[Hypothesis], pad_id: int, eos_id: int | None = None, max_len: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad hypotheses into one array, e.g. to re-score samples with teacher forcing (SCST); training code
    wraps the result with ``torch.from_numpy``.

    Args:
        hypotheses: N hypotheses.
        pad_id: fill value.
        eos_id: when given, EOS is appended to finished hypotheses (it is a scored token in SCST's loss).
        max_len: width of the result; default the longest sequence.

    Returns:
        tokens (N, T) int64 and lengths (N,) int64 (counting the appended EOS).
    """
    rows = [h.tokens + ([eos_id] if eos_id is not None and h.finished else []) for h in hypotheses]
    width = max((len(r) for r in rows), default=0) if max_len is None else max_len
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    lengths = np.zeros(len(rows), dtype=np.int64)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"hypothesis {i} has {len(row)} tokens, more than max_len={width}")
        out[i, : len(row)] = row
        lengths[i] = len(row)
    return out, lengths
