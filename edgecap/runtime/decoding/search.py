"""One step of candidate selection per strategy, in numpy (fairseq ``search.py`` style).

Every strategy has the same signature::

    step(step, lprobs (B, k, V), scores (B, k)) -> (cand_scores (B, C), cand_tokens (B, C), cand_beams (B, C))

where B is the number of groups (images for beam search, rows for greedy/sampling), k the live hypotheses per group,
``scores`` their running sums of log-probs and C the number of candidates returned. The loops in ``beam.py`` and
``greedy.py`` turn candidates into finished and running hypotheses; on their hot paths they call the leaner forms
``BeamSearch.candidates`` (flat ``beam * V + token`` indices) and ``Search.choose`` (row-wise, C = 1), which give the
same selections with fewer array ops per step.

Ordering. Candidates are ranked by score, best first; equal scores rank the lower index first and NaN ranks above
everything (as ``torch.topk`` treats it). ``torch.topk`` leaves the order of ties unspecified (on CPU it is not the
index order); this search fixes it, so the same log-probs give the same captions on every backend.
"""

from __future__ import annotations

import functools

import numpy as np

from edgecap.runtime.decoding.config import DecodeCfgError

NEG_INF32 = np.float32(-np.inf)


@functools.lru_cache(maxsize=64)
def _arange(n: int) -> np.ndarray:
    """A shared read-only ``arange(n)`` (row indices of the fancy-indexing gathers)."""
    out = np.arange(n)
    out.setflags(write=False)
    return out


def ranked(x: np.ndarray) -> np.ndarray:
    """(G, N) -> (G, N) int64: each row's column indices, best first; ties by lower index, NaN above everything."""
    nan = np.isnan(x)
    # lexsort is stable and sorts by its last key first: NaN first, then descending value, then index (stability).
    return np.lexsort((np.where(nan, 0.0, -x.astype(np.float64)), ~nan), axis=-1)


def top_candidates(total: np.ndarray, count: int, start: int = 0, work: np.ndarray | None = None) -> tuple:
    """The ``count`` best columns of every row of ``total`` (G, N), best first, in :func:`ranked` order.

    By repeated ``argmax`` — it returns the first maximum, NaN counting as the maximum — on a scratch copy where each
    pick is lowered to ``-inf``: for a handful of candidates this costs a few µs where ``argpartition`` of a row of
    thousands costs tens. Once a row's best remaining value is ``-inf`` the scratch no longer tells picked from
    unpicked entries, so such rows are ranked exactly by :func:`ranked`.

    Args:
        total: (G, N) float32.
        count: candidates wanted, <= N.
        start: candidates already picked in ``work`` (continue an earlier call).
        work: the scratch of an earlier call (``start`` > 0), else None.

    Returns:
        values (G, count - start) float32, indices (G, count - start) int64 and the scratch, to continue with.
    """
    groups = total.shape[0]
    if work is None:
        work = total.copy()
    if groups == 1:
        return _top_candidates_row(total, count, start, work)
    rows = _arange(groups)
    idx = np.empty((groups, count - start), dtype=np.int64)
    vals = np.empty((groups, count - start), dtype=total.dtype)
    for j in range(count - start):
        best = work.argmax(axis=1)
        idx[:, j] = best
        vals[:, j] = work[rows, best]
        work[rows, best] = NEG_INF32
    low = vals[:, -1] == NEG_INF32
    if low.any():  # -inf reached: the argmax of a row could be a pick lowered to -inf; rank those rows exactly
        for g in np.flatnonzero(low).tolist():
            order = ranked(total[g : g + 1])[0, start:count]
            idx[g] = order
            vals[g] = total[g, order]
    return vals, idx, work


def _top_candidates_row(total: np.ndarray, count: int, start: int, work: np.ndarray) -> tuple:
    """:func:`top_candidates` of a single row (batch 1): 1-D ``argmax`` and scalar reads/writes cost a fraction of
    their fancy-indexed (G, ·) forms."""
    row = work[0]
    picks = []
    last = NEG_INF32
    for _ in range(count - start):
        best = int(row.argmax())
        picks.append(best)
        last = row[best]  # the scratch's value: -inf once the argmax lands on an earlier (lowered) pick
        row[best] = NEG_INF32
    idx = np.array([picks], dtype=np.int64)
    vals = total[0, picks][None]
    if last == NEG_INF32:  # -inf reached: rank exactly (see top_candidates)
        idx = ranked(total)[:, start:count]
        vals = total[0, idx[0]][None]
    return vals, idx, work


class Search:
    """Base of the candidate selectors.

    Attributes:
        reveals_nan: a NaN anywhere in a row of log-probs always shows in that row's chosen log-prob (greedy's
            ``argmax`` returns a NaN first); lets the row loop use :meth:`ProcessorPlan.biased` and check only the
            chosen values.
    """

    reveals_nan = False

    def step(self, step: int, lprobs: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Select candidates; see the module docstring for shapes."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def choose(self, step: int, lprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The row-wise form (C = 1, k = 1) the greedy/sampling loop uses: no running scores, no reshapes.

        Args:
            step: t.
            lprobs: (N, V) processed float32 log-probs.

        Returns:
            tokens (N,) int64 and their log-probs (N,). The default goes through :meth:`step`.
        """
        _, tokens, _ = self.step(step, lprobs[:, None, :], np.zeros((lprobs.shape[0], 1), dtype=np.float32))
        tokens = tokens[:, 0]
        return tokens, lprobs[_arange(lprobs.shape[0]), tokens]


class GreedySearch(Search):
    """The most likely continuation of each hypothesis (C = 1; expects k = 1)."""

    reveals_nan = True

    def step(self, step: int, lprobs: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tokens, best_lp = self.choose(step, lprobs[:, 0, :])
        return scores[:, :1] + best_lp[:, None], tokens[:, None], np.zeros_like(tokens[:, None])

    def choose(self, step: int, lprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tokens = lprobs.argmax(axis=1)  # the first maximum; a NaN counts as the maximum and so shows in best_lp
        return tokens, lprobs[_arange(lprobs.shape[0]), tokens]


class BeamSearch(Search):
    """Top 2K continuations over all k·V (beam, token) pairs of a group.

    Returning 2K candidates (fairseq) guarantees at least K of them are not EOS, since each beam contributes only one
    EOS candidate; the loop keeps K running beams even when some candidates finish.
    """

    def __init__(self, beam_size: int) -> None:
        if beam_size < 1:
            raise DecodeCfgError(f"beam_size must be >= 1, got {beam_size}")
        self.beam_size = beam_size

    def step(self, step: int, lprobs: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        vocab = lprobs.shape[2]
        cand_scores, flat = self.candidates(lprobs, scores[:, :, None])
        return cand_scores, flat % vocab, flat // vocab

    def candidates(self, lprobs: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`step` without splitting the indices, as the beam loop consumes them.

        Args:
            lprobs: (B, k, V).
            scores: (B, k, 1) running sums.

        Returns:
            cand_scores (B, C) best first and flat (B, C) int64 indices ``beam * V + token`` into the k·V
            continuations, C = min(2K, k·V).
        """
        groups, k, vocab = lprobs.shape
        total = (lprobs + scores).reshape(groups, k * vocab)
        values, flat, _ = top_candidates(total, min(2 * self.beam_size, k * vocab))
        return values, flat


class Sampling(Search):
    """Draw one token per hypothesis from softmax(lprobs / temperature), optionally among the top k only.

    The candidate score adds the *untempered* log-prob, so scores stay log-probabilities under the model. Draws come
    from a ``numpy.random.Generator`` (PCG64) created per decode call: seeded, a run is repeatable on every backend
    and machine; unseeded, it draws fresh OS entropy. The streams differ from the torch generator this search used
    before, so a seed gives other samples than it did then.
    """

    def __init__(self, temperature: float = 1.0, top_k: int = 0, seed: int | None = None) -> None:
        if not temperature > 0:
            raise DecodeCfgError(f"temperature must be > 0, got {temperature}")
        if top_k < 0:
            raise DecodeCfgError(f"top_k must be >= 0, got {top_k}")
        self.temperature, self.top_k, self.seed = float(temperature), int(top_k), seed
        self._rng = np.random.default_rng(seed)

    def step(self, step: int, lprobs: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lp = lprobs[:, 0, :]
        tokens, token_lps = self.choose(step, lp)
        return scores[:, :1] + token_lps[:, None], tokens[:, None], np.zeros_like(tokens[:, None])

    def choose(self, step: int, lprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tokens = self._sample(lprobs)
        return tokens, lprobs[_arange(lprobs.shape[0]), tokens]

    def _sample(self, lp: np.ndarray) -> np.ndarray:
        """(N, V) untempered log-probs -> (N,) drawn tokens (temperature and top-k applied here only)."""
        logits = lp / np.float32(self.temperature) if self.temperature != 1.0 else lp
        vocab = logits.shape[-1]
        if 0 < self.top_k < vocab:
            kth = np.partition(logits, vocab - self.top_k, axis=-1)[:, vocab - self.top_k, None]
            logits = np.where(logits < kth, NEG_INF32, logits)
        with np.errstate(invalid="ignore"):  # a row without a legal token: -inf - -inf, handled in _draw
            shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
            probs = shifted / shifted.sum(axis=-1, keepdims=True)
        return self._draw(probs)

    def _draw(self, probs: np.ndarray) -> np.ndarray:
        """One token per row by inverse-CDF sampling: (N, V) probabilities -> (N,) int64.

        The token is the first index whose cumulative mass exceeds a uniform draw scaled to the row's total (a
        ``searchsorted(..., side="right")`` per row, as a vectorised count), so zero-probability (masked) tokens,
        whose cumulative value equals their predecessor's, are never chosen; a draw rounded up to the total mass
        falls back to the last token with positive probability. A row with no legal token at all (every log-prob
        ``-inf``, so softmax gives NaN) gets the last token, whose log-prob ``-inf`` marks the sample as impossible.
        """
        cdf = probs.cumsum(axis=-1)
        total = cdf[:, -1:]
        draw = self._rng.random(total.shape, dtype=np.float32) * total
        tokens = np.count_nonzero(cdf <= draw, axis=-1)
        last_positive = np.count_nonzero(cdf < total, axis=-1)  # first index whose cumulative mass reaches the total
        tokens = np.minimum(tokens, last_positive)
        tokens[~(total[:, 0] > 0)] = probs.shape[-1] - 1  # NaN rows: no legal token
        return tokens.astype(np.int64, copy=False)
