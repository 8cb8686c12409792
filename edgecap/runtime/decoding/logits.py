"""What every log-prob processor shares: the step context it may look at, its protocol, and ``-inf``.

Its own module so the processors (:mod:`edgecap.runtime.decoding.processors`) and the radix constraint
(:mod:`edgecap.runtime.decoding.radix`) both build on it without importing each other both ways.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["NEG_INF", "NEG_INF32", "LogitsProcessor", "StepContext"]

NEG_INF = float("-inf")
NEG_INF32 = np.float32(NEG_INF)


@dataclass(frozen=True)
class StepContext:
    """What a processor may look at besides the log-probs.

    Attributes:
        step: t, the number of tokens generated so far by every row (0 at the first step, after BOS).
        max_len: the configured maximum number of generated tokens.
        tokens: (N, t) int64 numpy array, the tokens generated so far by each row (no BOS).
    """

    step: int
    max_len: int
    tokens: np.ndarray


class LogitsProcessor(Protocol):
    """``(logprobs (N, V) float32 numpy, ctx) -> logprobs (N, V)``; may modify ``logprobs`` in place.

    A processor may also define ``step_mask(step, max_len, vocab_size) -> np.ndarray | None``: the (V,) bool mask of
    the tokens it bans in *every* row at ``step`` (all False: none), or None when that step's effect depends on the
    rows' tokens. Where it returns a mask the search applies the mask instead of calling the processor (the two must
    agree), so a step whose processors are all static costs one masked copy of the log-probs.
    """

    def __call__(self, logprobs: np.ndarray, ctx: StepContext) -> np.ndarray: ...
