"""Finished hypotheses of the vectorised beam search (:mod:`edgecap.runtime.decoding.beam`): per-step back-pointers,
traced only for the returned hypotheses, and each image's best finished ones as one array merged by a stable sort.
"""

from __future__ import annotations

import numpy as np

from edgecap.runtime.decoding._beam_ranking import NEG_INF, _column
from edgecap.runtime.decoding.protocol import Hypothesis


class _BackPointers:
    """Per step, for every running beam it produced ("output row"): its token, log-prob and parent output row of the
    previous step, as (rows,) arrays (rows shrink when pruning drops images)."""

    def __init__(self) -> None:
        self._tokens: list[np.ndarray] = []
        self._lps: list[np.ndarray] = []
        self._parents: list[np.ndarray] = []

    def append(self, tokens: np.ndarray, lps: np.ndarray, parents: np.ndarray) -> None:
        self._tokens.append(tokens)
        self._lps.append(lps)
        self._parents.append(parents)

    def trace(self, ends: np.ndarray, rows: np.ndarray) -> tuple[list[list[int]], list[list[float]]]:
        """Tokens and log-probs of output row ``rows[i]`` of step ``ends[i]``, from step 0 (``ends[i] = -1``:
        empty), for all i at once: one gather per step back."""
        n = int(ends.shape[0])
        width = int(ends.max()) + 1 if n else 0
        tokens = np.zeros((n, width), dtype=np.int64)
        lps = np.zeros((n, width), dtype=np.float32)
        current = rows.copy()
        for s in range(width - 1, -1, -1):
            live = np.flatnonzero(ends >= s)
            row = current[live]
            tokens[live, s] = self._tokens[s][row]
            lps[live, s] = self._lps[s][row]
            current[live] = self._parents[s][row]
        lengths = (ends + 1).tolist()
        tokens_l, lps_l = tokens.tolist(), lps.tolist()
        return (
            [r[:n_] for r, n_ in zip(tokens_l, lengths, strict=True)],
            [r[:n_] for r, n_ in zip(lps_l, lengths, strict=True)],
        )


class _Finished:
    """The best ``capacity`` finished hypotheses of every image, best first, as an (images, capacity, 5) array: the
    score (after the length penalty), where to trace the tokens from (step, output row), the EOS log-prob and the
    finished flag. Entries past ``count`` hold ``-inf`` scores.

    Adding keeps what appending to a per-image list and stably sorting it by descending score, truncated to
    ``capacity``, would keep (earlier hypotheses win ties): one stable sort of [kept, new] per image.
    """

    # Columns of ``entries``: every field fits a float64 exactly (ids < 2**53, float32 log-probs, 0/1 flags), so one
    # array holds them and a merge is one concatenate, one sort and one gather.
    SCORE, END, ROW, EOS_LP, FLAG = range(5)

    def __init__(self, images: int, capacity: int) -> None:
        self.capacity = capacity
        self.entries = np.zeros((images, capacity, 5))
        self.entries[:, :, self.SCORE] = NEG_INF
        self.count = np.zeros(images, dtype=np.int64)

    def full(self, images: np.ndarray) -> np.ndarray:
        return self.count[images] >= self.capacity

    def worst(self, images: np.ndarray) -> np.ndarray:
        """The lowest kept score (meaningful where :meth:`full`)."""
        return self.entries[images, self.capacity - 1, self.SCORE]

    def add(
        self,
        images: np.ndarray,
        valid: np.ndarray,
        score: np.ndarray,
        end: int,
        row: np.ndarray,
        eos_lp: np.ndarray | float,
        flag: bool,
    ) -> None:
        """Add, per image ``images[i]`` (distinct), the entries ``j`` where ``valid[i, j]``, in column order: scores
        (after the length penalty), the step and output row to trace from, the EOS log-prob (finished ones)."""
        n, w = valid.shape
        new = np.empty((n, w, 5))
        new[:, :, self.SCORE] = np.where(valid, score, NEG_INF)
        new[:, :, self.END] = end
        new[:, :, self.ROW] = row
        new[:, :, self.EOS_LP] = eos_lp
        new[:, :, self.FLAG] = flag
        nan = np.isnan(new[:, :, self.SCORE]).any(axis=1)
        if nan.any():  # NaN scores (force-finished beams of a NaN-emitting model): Python's own sort, per image
            for i in np.flatnonzero(nan).tolist():
                self._add_one(int(images[i]), valid[i], new[i])
            keep = ~nan
            images, valid, new = images[keep], valid[keep], new[keep]
        merged = np.concatenate([self.entries[images], new], axis=1)
        order = np.argsort(-merged[:, :, self.SCORE], axis=1, kind="stable")[:, : self.capacity]
        self.entries[images] = merged[_column(images.shape[0], 1), order]
        self.count[images] = np.minimum(self.count[images] + valid.sum(axis=1), self.capacity)

    def _add_one(self, image: int, valid: np.ndarray, new: np.ndarray) -> None:
        """:meth:`add` for one image the way a Python list does it (the order NaN scores get there)."""
        items = self.entries[image, : self.count[image]].tolist()
        for j in np.flatnonzero(valid).tolist():
            items.append(new[j].tolist())
            items.sort(key=lambda e: -e[0])
            del items[self.capacity :]
        if items:
            self.entries[image, : len(items)] = items
        self.count[image] = len(items)

    def hypotheses(self, n_best: int, pointers: _BackPointers) -> list[list[Hypothesis]]:
        """Each image's ``n_best`` best, traced back all at once."""
        taken = np.minimum(self.count, n_best)
        image, slot = np.nonzero(np.arange(self.capacity) < taken[:, None])
        picked = self.entries[image, slot]
        tokens, lps = pointers.trace(picked[:, self.END].astype(np.int64), picked[:, self.ROW].astype(np.int64))
        out: list[list[Hypothesis]] = [[] for _ in range(self.count.shape[0])]
        scores, eos_lps = picked[:, self.SCORE].tolist(), picked[:, self.EOS_LP].tolist()
        flags = (picked[:, self.FLAG] != 0).tolist()
        for i, (img, fin) in enumerate(zip(image.tolist(), flags, strict=True)):
            logprobs = [*lps[i], eos_lps[i]] if fin else lps[i]
            out[img].append(Hypothesis(tokens[i], scores[i], logprobs, fin))
        return out
