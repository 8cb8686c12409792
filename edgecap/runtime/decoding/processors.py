"""Log-prob processors and the length penalty: the knobs of a search, kept out of the search loops.

A processor maps the (N, V) float32 numpy log-probs of one step to (N, V) log-probs, usually by setting forbidden
tokens to ``-inf`` (fairseq / Hugging Face "logits processors"). Processors only ever *lower* log-probs and do not
renormalise, so a hypothesis score stays the model's log-probability of the sequence — which beam search's
stopping rule relies on.

Most bans do not depend on what a row has generated so far (PAD/BOS/``forbid_tokens`` always, EOS before
``min_len``, the radix constraint at a word boundary). Such a processor also offers :meth:`step_mask`, and a
:class:`ProcessorPlan` folds those masks into one precomputed (V,) mask per step, applied in the single copy the search
makes of a step's log-probs; only history-dependent processors run per step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from edgecap.runtime.decoding.config import DecodeCfg, DecodeCfgError
from edgecap.runtime.decoding.logits import NEG_INF, NEG_INF32, LogitsProcessor, StepContext
from edgecap.runtime.decoding.protocol import DecodeInputError
from edgecap.runtime.decoding.radix import RadixConstraint


@functools.lru_cache(maxsize=256)
def token_mask(vocab_size: int, token_ids: tuple[int, ...] = ()) -> np.ndarray:
    """A (V,) bool mask, True at ``token_ids``; shared and read-only (one object per argument pair, which lets
    :class:`ProcessorPlan` fold identical masks once)."""
    mask = np.zeros(vocab_size, dtype=bool)
    if token_ids:
        bad = [t for t in token_ids if not 0 <= t < vocab_size]
        if bad:
            raise DecodeInputError(f"token ids {bad} are outside the model's vocabulary of {vocab_size} classes")
        mask[list(token_ids)] = True
    mask.setflags(write=False)
    return mask


class ForbidTokens:
    """Never generate the given tokens (PAD and BOS always; optionally ``<unk>`` and others)."""

    def __init__(self, token_ids: Iterable[int]) -> None:
        self.token_ids = sorted(set(int(t) for t in token_ids))

    def __call__(self, logprobs: np.ndarray, ctx: StepContext) -> np.ndarray:
        if self.token_ids:
            logprobs[:, self.token_ids] = NEG_INF
        return logprobs

    def step_mask(self, step: int, max_len: int, vocab_size: int) -> np.ndarray:
        return token_mask(vocab_size, tuple(self.token_ids))

    def __repr__(self) -> str:
        return f"ForbidTokens({self.token_ids})"


class MinLength:
    """Forbid EOS until ``min_len`` tokens have been generated."""

    def __init__(self, min_len: int, eos_id: int) -> None:
        self.min_len, self.eos_id = min_len, eos_id

    def __call__(self, logprobs: np.ndarray, ctx: StepContext) -> np.ndarray:
        if ctx.step < self.min_len:
            logprobs[:, self.eos_id] = NEG_INF
        return logprobs

    def step_mask(self, step: int, max_len: int, vocab_size: int) -> np.ndarray:
        return token_mask(vocab_size, (self.eos_id,) if step < self.min_len else ())

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

    def __call__(self, logprobs: np.ndarray, ctx: StepContext) -> np.ndarray:
        tokens, n = ctx.tokens, self.n
        rows, t = tokens.shape
        if rows == 0 or t < n:  # no complete n-gram in the history yet
            return logprobs
        grams = np.lib.stride_tricks.sliding_window_view(tokens, n, axis=1)  # (N, t-n+1, n)
        tail = tokens[:, t - n + 1 :]  # (N, n-1): the prefix an n-gram ending now would start with
        valid = (grams[:, :, :-1] == tail[:, None, :]).all(axis=2)
        banned = grams[:, :, -1]
        vocab = logprobs.shape[1]
        # Scatter into one spare column so unmatched positions need no branch.
        mask = np.zeros((rows, vocab + 1), dtype=bool)
        mask[np.arange(rows)[:, None], np.where(valid, banned, vocab)] = True
        logprobs[mask[:, :vocab]] = NEG_INF
        return logprobs

    def step_mask(self, step: int, max_len: int, vocab_size: int) -> np.ndarray | None:
        return token_mask(vocab_size) if step < self.n else None  # no complete n-gram before step n

    def __repr__(self) -> str:
        return f"NoRepeatNGram({self.n})"


def apply_processors(processors: Sequence[LogitsProcessor], logprobs: np.ndarray, ctx: StepContext) -> np.ndarray:
    """Run ``processors`` in order on ``logprobs`` (N, V)."""
    for processor in processors:
        logprobs = processor(logprobs, ctx)
    return logprobs


def build_processors(cfg: DecodeCfg) -> list[LogitsProcessor]:
    """The processors a :class:`DecodeCfg` asks for: PAD/BOS (+ ``forbid_tokens``) masked, min length, n-gram
    blocking, and the radix constraint when ``cfg.radix`` is set."""
    processors: list[LogitsProcessor] = [ForbidTokens({cfg.pad_id, cfg.bos_id, *cfg.forbid_tokens})]
    if cfg.min_len > 0:
        processors.append(MinLength(cfg.min_len, cfg.eos_id))
    if cfg.no_repeat_ngram > 0:
        processors.append(NoRepeatNGram(cfg.no_repeat_ngram))
    if cfg.radix is not None:
        processors.append(RadixConstraint.from_spec(cfg.radix))
    return processors


class MaskColumns(NamedTuple):
    """The tokens a static mask allows and bans: ascending read-only int64 ids, and the same as contiguous
    ``(start, stop)`` runs (a radix word boundary allows one run of digits and EOS), which slices read faster than
    fancy indices."""

    allowed: np.ndarray
    banned: np.ndarray
    allowed_runs: tuple[tuple[int, int], ...]
    banned_runs: tuple[tuple[int, int], ...]


def _runs(ids: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Ascending ids as maximal ``(start, stop)`` runs of consecutive values."""
    if ids.shape[0] == 0:
        return ()
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts, stops = ids[np.r_[0, breaks]], ids[np.r_[breaks - 1, ids.shape[0] - 1]] + 1
    return tuple(zip(starts.tolist(), stops.tolist(), strict=True))


#: One resolved step: a (V,) bool mask, or a processor to call.
Segment = np.ndarray | LogitsProcessor


class ProcessorPlan:
    """The processors of a decode call, resolved once for every step ``t < max_len``.

    At each step, runs of consecutive processors that offer a static ``step_mask`` are folded into one mask (masks
    commute; order is kept relative to processors that must be called). Applying a step is then: one out-of-place
    ``np.where`` (the copy the search needs anyway, as processors write in place), then any dynamic processor.
    The result equals running the processors in order on a float32 copy. Steps that are a single mask also have a
    cheaper additive form, :meth:`biased`. Masks are built once per plan, and the plan of a ``DecodeCfg`` once per
    process (:func:`processor_plan`), so a decode call computes no mask at all.

    Args:
        processors: in application order.
        max_len: steps to resolve.
        vocab_size: V of the model's log-probs.

    Attributes:
        needs_history: some step calls a processor, so the search must supply ``StepContext.tokens``.
    """

    def __init__(self, processors: Sequence[LogitsProcessor], max_len: int, vocab_size: int) -> None:
        self.max_len, self.vocab_size = max_len, vocab_size
        fused: dict[tuple[int, ...], tuple[list[np.ndarray], np.ndarray | None]] = {}

        def fold(masks: list[np.ndarray]) -> np.ndarray | None:
            key = tuple(id(m) for m in masks)
            if key not in fused:
                union = np.asarray(masks[0])
                for m in masks[1:]:
                    union = union | np.asarray(m)
                if tuple(union.shape) != (vocab_size,) or union.dtype != np.bool_:
                    raise DecodeCfgError(
                        f"a step_mask must be a ({vocab_size},) bool array, got {union.dtype} {tuple(union.shape)}"
                    )
                fused[key] = (masks, union if bool(union.any()) else None)  # masks: keep ids alive
            return fused[key][1]

        self._steps: list[tuple[Segment, ...]] = []
        self._only: list[int | None] = []  # the one token a step's static masks leave legal, if exactly one
        self._biases: list[np.ndarray | None] = []  # steps that are one static mask: the mask as a -inf / -0.0 bias
        self._columns: list[MaskColumns | None] = []  # those steps' allowed and banned tokens
        biases: dict[int, np.ndarray] = {}
        columns: dict[int, MaskColumns] = {}
        for t in range(max_len):
            segments: list[Segment] = []
            pending: list[np.ndarray] = []
            for processor in processors:
                static = getattr(processor, "step_mask", None)
                mask = static(t, max_len, vocab_size) if static is not None else None
                if mask is not None:
                    pending.append(mask)
                    continue
                if pending and (folded := fold(pending)) is not None:
                    segments.append(folded)
                pending = []
                segments.append(processor)
            if pending and (folded := fold(pending)) is not None:
                segments.append(folded)
            self._steps.append(tuple(segments))
            self._only.append(_only_allowed([s for s in segments if isinstance(s, np.ndarray)]))
            only = segments[0] if len(segments) == 1 else None
            if isinstance(only, np.ndarray) and id(only) not in biases:
                biases[id(only)] = np.where(only, NEG_INF32, np.float32(-0.0))
                allowed, banned = np.flatnonzero(~only), np.flatnonzero(only)
                for array in (biases[id(only)], allowed, banned):
                    array.setflags(write=False)
                columns[id(only)] = MaskColumns(allowed, banned, _runs(allowed), _runs(banned))
            self._biases.append(biases[id(only)] if isinstance(only, np.ndarray) else None)
            self._columns.append(columns[id(only)] if isinstance(only, np.ndarray) else None)
        self.needs_history = any(not isinstance(s, np.ndarray) for step in self._steps for s in step)

    def __call__(self, logprobs: np.ndarray, step: int, tokens: np.ndarray | None = None) -> np.ndarray:
        """Processed float32 log-probs of ``step``: a new array whenever anything is masked (the input may be a
        buffer the backend owns), else ``logprobs`` itself (as float32).

        Args:
            logprobs: (N, V).
            step: t.
            tokens: (N, t) history, required when :attr:`needs_history`.
        """
        segments = self._steps[step]
        if logprobs.dtype != np.float32:
            logprobs = logprobs.astype(np.float32)
        if not segments:
            return logprobs
        first, rest = segments[0], segments[1:]
        if isinstance(first, np.ndarray):
            logprobs = np.where(first, NEG_INF32, logprobs)
        else:
            logprobs, rest = logprobs.copy(), segments
        ctx = None
        for segment in rest:
            if isinstance(segment, np.ndarray):
                np.copyto(logprobs, NEG_INF32, where=segment)
                continue
            if ctx is None:
                if tokens is None:
                    raise ValueError(f"step {step}: {segment!r} needs the token history (StepContext.tokens)")
                ctx = StepContext(step, self.max_len, tokens)
            logprobs = segment(logprobs, ctx)
        return logprobs

    def only_token(self, step: int) -> int | None:
        """The one token the static masks of ``step`` leave legal, else None (history-dependent processors can only
        ban more). A step whose only legal token is EOS is the length cap of a radix search: no whole word fits
        before ``max_len`` (:class:`~edgecap.runtime.decoding.radix.RadixConstraint`), so the searches end there and
        take their hypotheses as they stand instead of scoring a forced EOS."""
        return self._only[step]

    def bias(self, step: int) -> np.ndarray | None:
        """The (V,) float32 ``-inf`` (banned) / ``-0.0`` (allowed) bias of a step that is one static mask, else None:
        what :meth:`biased` adds, for callers that fuse the add into their own buffers (read-only: shared)."""
        return self._biases[step]

    def mask_columns(self, step: int) -> MaskColumns | None:
        """For a step that is one static mask (:meth:`bias` is not None): its allowed and banned tokens; else None."""
        return self._columns[step]

    def biased(self, logprobs: np.ndarray, step: int, tokens: np.ndarray | None = None) -> tuple[np.ndarray, bool]:
        """:meth:`__call__` by one vectorised add where the step is a single static mask; returns the log-probs and
        whether the add was used.

        Adding a bias of ``-inf`` (banned) / ``-0.0`` (allowed) gives every allowed entry back bit for bit
        (``x + -0.0 == x`` for every x, signed zeros included) and ``-inf`` at every banned entry, except where the
        input holds NaN or ``+inf`` at a banned token: those become NaN, which ranks first among the candidates
        (:mod:`~edgecap.runtime.decoding.search`), so a caller that sees no NaN among its top candidates has exactly
        :meth:`__call__`'s result; otherwise it calls that. The add is about three times cheaper than ``np.where``
        with a broadcast mask.
        """
        bias = self._biases[step]
        if bias is None or logprobs.dtype != np.float32:
            return self(logprobs, step, tokens), False
        return logprobs + bias, True


def _only_allowed(masks: Sequence[np.ndarray]) -> int | None:
    """The one token no mask of ``masks`` bans, or None (several, none, or no mask at all)."""
    if not masks:
        return None
    banned = functools.reduce(np.logical_or, masks)
    allowed = np.flatnonzero(~banned)
    return int(allowed[0]) if allowed.shape[0] == 1 else None


@functools.lru_cache(maxsize=32)
def _plan_for_cfg(cfg: DecodeCfg, vocab_size: int) -> ProcessorPlan:
    return ProcessorPlan(build_processors(cfg), cfg.max_len, vocab_size)


def processor_plan(cfg: DecodeCfg, processors: Sequence[LogitsProcessor] | None, vocab_size: int) -> ProcessorPlan:
    """The plan of a decode call: cached per ``(cfg, V)`` when the processors come from ``cfg`` (they are
    stateless), built afresh for explicitly given ones."""
    if processors is not None:
        return ProcessorPlan(list(processors), cfg.max_len, vocab_size)
    try:
        return _plan_for_cfg(cfg, vocab_size)
    except TypeError:  # an unhashable field (e.g. forbid_tokens given as a set): build without the cache
        return ProcessorPlan(build_processors(cfg), cfg.max_len, vocab_size)


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
