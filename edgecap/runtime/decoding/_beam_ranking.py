"""One step's candidates for the vectorised beam search (:mod:`edgecap.runtime.decoding.beam`): the totals of every
continuation in a reused buffer, the best ones picked by repeated ``argmax``, and their log-probs read back.

The search calls these a fixed number of times per step whatever the batch, so each is a handful of numpy ops; the
masked add keeps a static mask's cost below a masked copy (see :class:`_Ranking`).
"""

from __future__ import annotations

import functools

import numpy as np

from edgecap.runtime.decoding.processors import MaskColumns
from edgecap.runtime.decoding.search import ranked

NEG_INF = float("-inf")
NEG_INF32 = np.float32(NEG_INF)
_MAX_RUNS = 8  # a static mask's columns as at most this many slices; more: one fancy-indexed gather


@functools.lru_cache(maxsize=64)
def _arange(n: int) -> np.ndarray:
    """A shared read-only ``arange(n)``."""
    out = np.arange(n)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=64)
def _column(n: int, scale: int) -> np.ndarray:
    """A shared read-only (n, 1) ``arange(n) * scale``: the first row (or flat index) of each group."""
    out = (np.arange(n) * scale)[:, None]
    out.setflags(write=False)
    return out


class _LogprobsAt:
    """The processed log-probs of a step at given candidates, read back from the model's rows (and the step's mask):
    the same float32 values, bit for bit, that exact masking gives (``x + -0.0 == x``: those that were summed into the
    ranked totals)."""

    def __init__(self, source: np.ndarray, bias: np.ndarray | None, k: int, vocab: int) -> None:
        self.source, self.bias, self.k, self.vocab = source, bias, k, vocab

    def __call__(self, flat: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """Candidates ``flat`` (flat ``beam * V + token`` indices) of groups ``groups`` (broadcast against ``flat``)."""
        tokens = flat % self.vocab
        lp = self.source[groups * self.k + flat // self.vocab, tokens]
        # A masked token reads -inf, as exact masking writes it (adding the bias would turn a NaN there into NaN).
        return np.where(self.bias[tokens] == 0, lp, NEG_INF32) if self.bias is not None else lp


def _top_k(work: np.ndarray, count: int, restore: bool) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` largest columns of every row of ``work`` (G, N), best first, by repeated ``argmax`` (the first
    maximum; NaN counts as the maximum): each pick is lowered to ``-inf`` in ``work`` itself, and put back when
    ``restore``. For a handful of picks this costs a few passes where ``argpartition`` of wide rows costs tens.

    Once a row's best remaining value is ``-inf`` the lowered picks can no longer be told from the rest, so a row
    whose last pick is ``-inf`` must be ranked exactly by the caller (:meth:`_Ranking.top`).

    Returns:
        values (G, count) float32 and indices (G, count) int64.
    """
    groups = work.shape[0]
    if groups == 1:  # 1-D argmax and scalar reads/writes cost a fraction of their fancy-indexed (G, ·) forms
        row, picks, values = work[0], [], []
        for _ in range(count):
            best = int(row.argmax())
            picks.append(best)
            values.append(row[best])
            row[best] = NEG_INF32
        if restore:
            for best, value in zip(reversed(picks), reversed(values), strict=True):
                row[best] = value
        return np.array([values], dtype=work.dtype), np.array([picks], dtype=np.int64)
    rows = _arange(groups)
    idx = np.empty((groups, count), dtype=np.int64)
    vals = np.empty((groups, count), dtype=work.dtype)
    for j in range(count):
        best = work.argmax(axis=1)
        idx[:, j] = best
        vals[:, j] = work[rows, best]
        work[rows, best] = NEG_INF32
    if restore:
        for j in range(count - 1, -1, -1):  # reverse: a pick repeated after -inf was reached restores its first value
            work[rows, idx[:, j]] = vals[:, j]
    return vals, idx


class _Ranking:
    """One step's totals (running sum + processed log-prob of every continuation) in a reused buffer, and their best
    candidates in :func:`~edgecap.runtime.decoding.search.ranked` order (ties: lower index first; NaN first).

    Where the step's processors are one static mask (:meth:`ProcessorPlan.bias`), the masked add costs less than a
    masked copy:

    - few allowed tokens (a radix constraint at a word boundary): only the allowed columns are summed and ranked
      (``columns``), since a banned continuation is ``-inf`` (while no running sum is NaN or ``+inf``) and can rank
      only in a row whose picks reach ``-inf``, which is then ranked exactly over all k·V continuations;
    - few banned tokens: the plain sum, then the banned columns recomputed with the bias (``patch``);
    - otherwise the bias added in full.

    ``x + -0.0 == x`` for every float, so the totals are bit for bit those of adding the bias everywhere, except
    that NaN / ``+inf`` at a banned token gives NaN instead of ``-inf`` (never in ``columns`` mode, which does not
    read banned tokens); :attr:`exact_needed` tells the caller to redo such a step with exact masking.
    """

    def __init__(
        self,
        buffer: np.ndarray,
        raw: np.ndarray,
        scores: np.ndarray,
        bias: np.ndarray | None,
        columns: MaskColumns | None,
        width: int,
    ) -> None:
        groups, k = scores.shape[0], scores.shape[1]
        vocab = raw.shape[1]
        self.vocab, self.k, self.raw, self.scores, self.bias = vocab, k, raw, scores, bias
        self.columns: np.ndarray | None = None
        self.exact_needed = bias is not None
        raw3 = raw.reshape(groups, k, vocab)
        if bias is None:  # raw: the processed log-probs already
            total = buffer[: raw.size].reshape(groups, k, vocab)
            np.add(raw3, scores, out=total)
        elif (
            columns is not None
            and 2 * columns.allowed.shape[0] <= vocab
            and columns.allowed.shape[0] * k >= width
            and scores.max() < np.inf  # a banned total is -inf + sum: -inf unless the sum is NaN or +inf
        ):
            allowed = self.columns = columns.allowed
            total = buffer[: groups * k * allowed.shape[0]].reshape(groups, k, allowed.shape[0])
            if len(columns.allowed_runs) <= _MAX_RUNS:
                at = 0
                for start, stop in columns.allowed_runs:
                    np.add(raw3[:, :, start:stop], scores, out=total[:, :, at : at + stop - start])
                    at += stop - start
            else:
                np.add(raw3[:, :, allowed], scores, out=total)
            self.exact_needed = False
        elif columns is not None and 2 * columns.banned.shape[0] <= vocab:
            total = buffer[: raw.size].reshape(groups, k, vocab)
            np.add(raw3, scores, out=total)
            if len(columns.banned_runs) <= _MAX_RUNS:
                for start, stop in columns.banned_runs:
                    total[:, :, start:stop] = (raw3[:, :, start:stop] + bias[start:stop]) + scores
            else:
                banned = columns.banned
                total[:, :, banned] = (raw3[:, :, banned] + bias[banned]) + scores
        else:
            total = buffer[: raw.size].reshape(groups, k, vocab)
            np.add(raw3, bias, out=total)
            np.add(total, scores, out=total)
        self.total = total.reshape(groups, -1)

    def _exact_rows(self, groups: np.ndarray) -> np.ndarray:
        """(n, k·V) totals of ``groups`` with exact masking (banned: ``-inf``)."""
        k, vocab = self.k, self.vocab
        raw = self.raw.reshape(-1, k, vocab)[groups]
        if self.bias is not None:
            raw = np.where(self.bias == 0, raw, NEG_INF32)
        return (raw + self.scores[groups]).reshape(groups.shape[0], k * vocab)

    def top(self, count: int, groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``count`` best continuations of every group (or of ``groups``): values (n, count) float32, flat
        ``beam * V + token`` indices (n, count) int64."""
        if groups is None:
            vals, idx = _top_k(self.total, count, restore=True)
        else:
            vals, idx = _top_k(self.total[groups], count, restore=False)
        if self.columns is not None:
            allowed = self.columns.shape[0]
            idx = (idx // allowed) * self.vocab + self.columns[idx % allowed]
        low = vals[:, -1] == NEG_INF32
        if low.any():  # -inf reached: rank those rows exactly over every continuation
            rows = np.flatnonzero(low)
            which = rows if groups is None else groups[rows]
            full = self._exact_rows(which) if self.columns is not None else self.total[which]
            for i, g in enumerate(rows.tolist()):
                order = ranked(full[i : i + 1])[0, :count]
                idx[g] = order
                vals[g] = full[i, order]
        return vals, idx
