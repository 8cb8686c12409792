"""Log-prob processors and the length penalty: the knobs of a search, kept out of the search loops.

A processor maps the (N, V) log-probs of one step to (N, V) log-probs, usually by setting forbidden tokens to
``-inf`` (fairseq / Hugging Face "logits processors"). Processors only ever *lower* log-probs and do not
renormalise, so a hypothesis score stays the model's log-probability of the sequence — which beam search's
stopping rule relies on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from edgecap.decoding.config import DecodeCfg, DecodeCfgError

NEG_INF = float("-inf")


@dataclass(frozen=True)
class StepContext:
    """What a processor may look at besides the log-probs.

    Attributes:
        step: t, the number of tokens generated so far by every row (0 at the first step, after BOS).
        max_len: the configured maximum number of generated tokens.
        tokens: (N, t) long, the tokens generated so far by each row (no BOS).
    """

    step: int
    max_len: int
    tokens: Tensor


class LogitsProcessor(Protocol):
    """``(logprobs (N, V), ctx) -> logprobs (N, V)``; may modify ``logprobs`` in place."""

    def __call__(self, logprobs: Tensor, ctx: StepContext) -> Tensor: ...


class ForbidTokens:
    """Never generate the given tokens (PAD and BOS always; optionally ``<unk>`` and others)."""

    def __init__(self, token_ids: Iterable[int]) -> None:
        self.token_ids = sorted(set(int(t) for t in token_ids))

    def __call__(self, logprobs: Tensor, ctx: StepContext) -> Tensor:
        if self.token_ids:
            logprobs[:, self.token_ids] = NEG_INF
        return logprobs

    def __repr__(self) -> str:
        return f"ForbidTokens({self.token_ids})"


class MinLength:
    """Forbid EOS until ``min_len`` tokens have been generated."""

    def __init__(self, min_len: int, eos_id: int) -> None:
        self.min_len, self.eos_id = min_len, eos_id

    def __call__(self, logprobs: Tensor, ctx: StepContext) -> Tensor:
        if ctx.step < self.min_len:
            logprobs[:, self.eos_id] = NEG_INF
        return logprobs

    def __repr__(self) -> str:
        return f"MinLength({self.min_len}, eos_id={self.eos_id})"


class NoRepeatNGram:
    """Forbid any token that would repeat an n-gram already present in the row (fairseq ``no_repeat_ngram_size``).

    Vectorised over rows: every (n−1)-gram of the history is compared with the row's last n−1 tokens, and the token
    that followed each match is banned.
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise DecodeCfgError(f"no_repeat_ngram must be >= 1, got {n}")
        self.n = n

    def __call__(self, logprobs: Tensor, ctx: StepContext) -> Tensor:
        tokens, n = ctx.tokens, self.n
        rows, t = tokens.shape
        if rows == 0 or t < n:  # no complete n-gram in the history yet
            return logprobs
        grams = tokens.unfold(1, n, 1)  # (N, t-n+1, n)
        tail = tokens[:, t - n + 1 :]  # (N, n-1): the prefix an n-gram ending now would start with
        valid = (grams[:, :, :-1] == tail[:, None, :]).all(dim=2)
        banned = grams[:, :, -1]
        vocab = logprobs.shape[1]
        # Scatter into one spare column so unmatched positions need no branch.
        mask = torch.zeros(rows, vocab + 1, dtype=torch.bool, device=logprobs.device)
        mask.scatter_(1, torch.where(valid, banned, torch.full_like(banned, vocab)), True)
        return logprobs.masked_fill_(mask[:, :vocab], NEG_INF)

    def __repr__(self) -> str:
        return f"NoRepeatNGram({self.n})"


def apply_processors(processors: Sequence[LogitsProcessor], logprobs: Tensor, ctx: StepContext) -> Tensor:
    """Run ``processors`` in order on ``logprobs`` (N, V)."""
    for processor in processors:
        logprobs = processor(logprobs, ctx)
    return logprobs


def build_processors(cfg: DecodeCfg) -> list[LogitsProcessor]:
    """The processors a :class:`DecodeCfg` asks for: PAD/BOS (+ ``forbid_tokens``) masked, min length, n-gram
    blocking, and the radix constraint when ``cfg.radix`` is set."""
    from edgecap.decoding.radix import RadixConstraint

    processors: list[LogitsProcessor] = [ForbidTokens({cfg.pad_id, cfg.bos_id, *cfg.forbid_tokens})]
    if cfg.min_len > 0:
        processors.append(MinLength(cfg.min_len, cfg.eos_id))
    if cfg.no_repeat_ngram > 0:
        processors.append(NoRepeatNGram(cfg.no_repeat_ngram))
    if cfg.radix is not None:
        processors.append(RadixConstraint.from_spec(cfg.radix))
    return processors


class LengthPenalty:
    """Score of a finished hypothesis from its summed log-prob and length L (tokens scored, EOS included).

    - ``"none"``: the sum itself (ACORT/ORT decode "without length normalisation").
    - ``"wu"``: sum / ((5 + L) / 6) ** alpha (GNMT, Wu et al. 2016, Eq. 14).
    - ``"avg"``: sum / L ** alpha (alpha = 1 is the per-token average).
    """

    def __init__(self, kind: str = "none", alpha: float = 0.0) -> None:
        if kind not in ("none", "wu", "avg"):
            raise DecodeCfgError(f"length_penalty must be 'none', 'wu' or 'avg', got {kind!r}")
        self.kind, self.alpha = kind, float(alpha)

    @property
    def active(self) -> bool:
        return self.kind != "none" and self.alpha != 0.0

    def divisor(self, length: int) -> float:
        """The penalty lp(L) the summed log-prob is divided by."""
        if not self.active:
            return 1.0
        base = (5.0 + length) / 6.0 if self.kind == "wu" else float(max(length, 1))
        return base**self.alpha

    def __call__(self, logprob: float, length: int) -> float:
        return logprob / self.divisor(length)

    def upper_bound(self, logprob: float, min_length: int, max_length: int) -> float:
        """The best score any extension of a running hypothesis could still reach.

        Log-probs are <= 0, so a running sum only decreases; lp(L) is monotone in L, so the bound is the current sum
        divided by the largest (for a negative sum) or smallest (positive) lp over the lengths still reachable.
        """
        if math.isinf(logprob) and logprob < 0:
            return NEG_INF
        if not self.active:
            return logprob
        ends = (self.divisor(min_length), self.divisor(max_length))
        return logprob / (max(ends) if logprob <= 0 else min(ends))

    def __repr__(self) -> str:
        return f"LengthPenalty({self.kind!r}, alpha={self.alpha})"
