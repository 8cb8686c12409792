"""The beam search of :mod:`edgecap.runtime.decoding.beam` run image by image in Python lists, for small batches.

At a handful of images the vectorised search's fixed cost — a few dozen numpy calls per step, about 1 µs each —
exceeds the per-image Python work it replaces, so :func:`~edgecap.runtime.decoding.beam.beam_search` hands small
batches to
this form. Both follow the same rules (the module docstring of :mod:`edgecap.runtime.decoding.beam`) and return the same
hypotheses bit for bit (``tests/runtime/decoding/test_beam_equivalence.py`` checks both against one reference).

Per step: candidates are picked best first by repeated ``argmax``
(:func:`~edgecap.runtime.decoding.search.top_candidates`), the top K only when no EOS ranks within any image's top K;
each
step stores back-pointers (token, log-prob, parent row) and a hypothesis is traced back when it finishes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import cast

import numpy as np

from edgecap.runtime.decoding.config import DecodeCfg
from edgecap.runtime.decoding.processors import LengthPenalty, LogitsProcessor, processor_plan
from edgecap.runtime.decoding.protocol import Hypothesis, State, StepModel, as_logprobs
from edgecap.runtime.decoding.search import top_candidates

NEG_INF = float("-inf")


class _Finished:
    """The best ``capacity`` finished hypotheses of one image, best first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: list[Hypothesis] = []

    def add(self, hyp: Hypothesis) -> None:
        self.items.append(hyp)
        self.items.sort(key=lambda h: -h.score)  # stable: earlier hypotheses win ties
        del self.items[self.capacity :]

    @property
    def full(self) -> bool:
        return len(self.items) >= self.capacity

    @property
    def worst(self) -> float:
        return self.items[-1].score if self.items else NEG_INF


class _BackPointers:
    """Per step, for every running beam it produced ("output row"): its token, log-prob and parent output row of the
    previous step, appended as lists — except the log-probs of a fast step, kept as the array of the step's
    candidates and converted to a list only when a hypothesis is first traced through that step.

    ``row_map`` of a step maps its *input* rows to the previous step's output rows; it is None (identity) unless
    pruning dropped rows in between.
    """

    def __init__(self) -> None:
        self._tokens: list[list[int]] = []
        self._parents: list[list[int]] = []
        self._lps: list[list[float] | tuple[np.ndarray, int]] = []
        self._unread: list[int] = []  # steps whose log-probs are still arrays, in order

    def append(
        self, tokens: list[int], lps: list[float] | tuple[np.ndarray, int], src: list[int], row_map: list[int] | None
    ) -> None:
        """``src``: each output row's parent as an input row of this step; ``lps``: a list, or ``(array, width)``
        for the first ``width`` columns of a (groups, C) array, row-major."""
        if isinstance(lps, tuple):
            self._unread.append(len(self._lps))
        self._tokens.append(tokens)
        self._parents.append(src if row_map is None else [row_map[r] for r in src])
        self._lps.append(lps)

    def _read(self, t: int) -> None:
        """Convert the log-probs of every step up to ``t`` still held as arrays to lists."""
        steps = [s for s in self._unread if s <= t]
        self._unread = self._unread[len(steps) :]
        for s in steps:
            array, width = cast("tuple[np.ndarray, int]", self._lps[s])
            self._lps[s] = array[:, :width].ravel().tolist()

    def trace(self, t: int, row: int) -> tuple[list[int], list[float]]:
        """Tokens and log-probs of output row ``row`` of step ``t``, from step 0 (``t = -1``: empty)."""
        if self._unread and self._unread[0] <= t:
            self._read(t)
        tokens, lps = [], []
        all_tokens, all_lps, all_parents = self._tokens, self._lps, self._parents
        for s in range(t, -1, -1):
            tokens.append(all_tokens[s][row])
            lps.append(cast("list[float]", all_lps[s])[row])  # a list: read above
            row = all_parents[s][row]
        tokens.reverse()
        lps.reverse()
        return tokens, lps


def _has_nan(rows: list[list[float]]) -> bool:
    """A NaN ranks first, so one anywhere shows among the top candidates."""
    total = sum(map(sum, rows))  # NaN propagates (as does +inf + -inf, a harmless false alarm)
    return total != total


@functools.lru_cache(maxsize=64)
def _rows(groups: int) -> np.ndarray:
    """(groups, 1) row indices of the per-group candidate gathers (a fancy index is cheaper than take_along_axis)."""
    out = np.arange(groups)[:, None]
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=64)
def _identity(n: int) -> list[int]:
    return list(range(n))


def _long(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def beam_search_rows(
    step_model: StepModel,
    state: State,
    images: int,
    cfg: DecodeCfg,
    processors: list[LogitsProcessor] | None,
) -> list[list[Hypothesis]]:
    """:func:`~edgecap.runtime.decoding.beam.beam_search` from the encoded ``state`` of ``images`` images, per image."""
    procs = processors
    beam, eos, max_len = cfg.beam_size, cfg.eos_id, cfg.max_len
    penalty = LengthPenalty(cfg.length_penalty, cfg.length_penalty_alpha)
    bounded = penalty.active  # without a penalty a running beam's bound is its current sum
    finished = [_Finished(beam) for _ in range(images)]
    done = [False] * images
    active = list(range(images))  # image of each group of rows in the batch
    pointers = _BackPointers()
    row_map: list[int] | None = None  # input rows of this step -> output rows of the previous one (None: identity)
    plan = None
    n_done = 0
    eos_at: dict[int, set[int]] = {}  # k -> flat indices of EOS among k·V continuations

    k = 1  # live beams per image: 1 at step 0, K afterwards
    live_tokens = np.full(images, cfg.bos_id, dtype=np.int64)
    scores = np.zeros((images, 1, 1), dtype=np.float32)  # (groups, k, 1) running sums
    history = np.empty((images, 0), dtype=np.int64)  # (rows, t), kept only if a processor reads it

    for t in range(max_len):
        groups = len(active)
        if plan is not None and plan.only_token(t) == eos:  # the radix cap: take the running beams as they stand
            _finish_running(scores, pointers, t - 1, beam, active, done, finished, penalty, row_map)
            break
        raw, state = step_model.step(live_tokens, state)
        raw = as_logprobs(raw, groups * k)
        if plan is None:
            plan = processor_plan(cfg, procs, raw.shape[1])
        vocab = raw.shape[1]
        width = min(2 * beam, k * vocab)  # C candidates per group
        first = min(beam, width)  # picked first: enough when no EOS ranks within them
        lp, biased = plan.biased(raw, t, history)
        total = (lp.reshape(groups, k, vocab) + scores).reshape(groups, k * vocab)
        cand_scores, flat, work = top_candidates(total, first)
        scores_l = cand_scores.tolist()
        if biased and _has_nan(scores_l):  # a NaN/+inf under a mask: redo this step with exact masking
            lp = plan(raw, t, history)
            total = (lp.reshape(groups, k, vocab) + scores).reshape(groups, k * vocab)
            cand_scores, flat, work = top_candidates(total, first)
            scores_l = cand_scores.tolist()
        flat_l = flat.tolist()
        eos_flat = eos_at.get(k) or eos_at.setdefault(k, {b * vocab + eos for b in range(k)})
        lp2 = lp.reshape(groups, k * vocab)
        rows = _rows(groups)

        if first >= beam and all(eos_flat.isdisjoint(row) for row in flat_l):
            # No EOS within any image's top K: the K best candidates run on, nothing finishes.
            tokens_h = [f % vocab for row in flat_l for f in row]
            src_h = [g * k + f // vocab for g, row in enumerate(flat_l) for f in row]
            next_scores = cand_scores[:, :, None]
            best = [row[0] for row in scores_l]
            pointers.append(tokens_h, (lp2[rows, flat], beam), src_h, row_map)
        else:
            if width > first:  # the next K candidates, continuing the same picks
                more_scores, more_flat, _ = top_candidates(total, width, first, work)
                cand_scores = np.concatenate([cand_scores, more_scores], axis=1)
                flat = np.concatenate([flat, more_flat], axis=1)
            search = _RowsSearch(active, done, finished, penalty, pointers, row_map)
            tokens_h, src_h, scores_h, lps_h, best = _select_with_eos(
                flat.tolist(), cand_scores.tolist(), lp2[rows, flat].tolist(), vocab, k, t, cfg, search
            )
            next_scores = np.asarray(scores_h, dtype=np.float32).reshape(groups, beam, 1)
            pointers.append(tokens_h, lps_h, src_h, row_map)

        if t == max_len - 1:
            _finish_running(next_scores, pointers, t, beam, active, done, finished, penalty)
            break
        newly_done = False
        for g, image in enumerate(active):
            if done[image]:
                continue
            bound = penalty.upper_bound(best[g], t + 2, max_len) if bounded else best[g]  # same value, inlined
            if bound == NEG_INF or (finished[image].full and bound <= finished[image].worst):
                done[image] = newly_done = True
                n_done += 1
        if n_done == images:
            break

        row_map = None
        if newly_done and cfg.prune_finished:
            keep = [g for g, image in enumerate(active) if not done[image]]
            row_map = [g * beam + b for g in keep for b in range(beam)]
            src_h, tokens_h = [src_h[r] for r in row_map], [tokens_h[r] for r in row_map]
            scores = next_scores[_long(keep)]
            active = [active[g] for g in keep]
        else:
            scores = next_scores
        live_tokens = _long(tokens_h)
        if len(src_h) != groups * k or src_h != _identity(len(src_h)):  # each beam continuing itself: no gather
            index = _long(src_h)
            state = step_model.select(state, index)
            if plan.needs_history:
                history = history[index]
        if plan.needs_history:
            history = np.concatenate([history, live_tokens[:, None]], axis=1)
        k = beam

    return [f.items[: cfg.n_best] for f in finished]


@dataclass(frozen=True, slots=True)
class _RowsSearch:
    """The per-image search's state that a selection reads and updates: the image of each group, which images are
    done, their finished hypotheses, the length penalty, the back-pointers and this step's row map."""

    active: list[int]
    done: list[bool]
    finished: list[_Finished]
    penalty: LengthPenalty
    pointers: _BackPointers
    row_map: list[int] | None


def _select_with_eos(
    flat: list[list[int]],
    cand_scores: list[list[float]],
    cand_lps: list[list[float]],
    vocab: int,
    k: int,
    t: int,
    cfg: DecodeCfg,
    search: _RowsSearch,
) -> tuple[list[int], list[int], list[float], list[float], list[float]]:
    """The general selection, on the host, for a step where some EOS ranks within an image's top K.

    Per image: EOS candidates ranked within the top K with a finite score finish (in rank order, unless the image is
    done); the running beams are the non-EOS candidates in rank order, then EOS ones (dead), then padding (dead) if
    fewer than K candidates exist.

    Returns:
        The next beams (tokens, source input rows, scores, log-probs; K per image, image-major) and each image's
        best running score.
    """
    beam, pad_id, eos_id = cfg.beam_size, cfg.pad_id, cfg.eos_id
    active, done, finished, penalty = search.active, search.done, search.finished, search.penalty
    pointers, row_map = search.pointers, search.row_map
    tokens, src, scores, lps, best = [], [], [], [], []
    for g, (row, row_scores, row_lps) in enumerate(zip(flat, cand_scores, cand_lps, strict=True)):
        is_eos = [f % vocab == eos_id for f in row]
        order = [j for j, e in enumerate(is_eos) if not e] + [j for j, e in enumerate(is_eos) if e]
        image = active[g]
        for j, e in enumerate(is_eos[:beam]):
            if e and math.isfinite(row_scores[j]) and not done[image]:
                prefix, prefix_lps = pointers.trace(t - 1, _out_row(g * k + row[j] // vocab, row_map))
                finished[image].add(Hypothesis(prefix, penalty(row_scores[j], t + 1), [*prefix_lps, row_lps[j]], True))
        chosen = order[:beam]
        for j in chosen:
            tokens.append(row[j] % vocab)
            src.append(g * k + row[j] // vocab)
            scores.append(NEG_INF if is_eos[j] else row_scores[j])
            lps.append(row_lps[j])
        for _ in range(beam - len(chosen)):  # fewer than K candidates exist (tiny vocabulary): dead beams
            tokens.append(pad_id)
            src.append(g * k + row[chosen[0]] // vocab)
            scores.append(NEG_INF)
            lps.append(NEG_INF)
        best.append(scores[g * beam])  # non-EOS candidates come first, best first: column 0 is the maximum
    return tokens, src, scores, lps, best


def _out_row(row: int, row_map: list[int] | None) -> int:
    return row if row_map is None else row_map[row]


def _finish_running(
    scores: np.ndarray,
    pointers: _BackPointers,
    t: int,
    beam: int,
    active: list[int],
    done: list[bool],
    finished: list[_Finished],
    penalty: LengthPenalty,
    row_map: list[int] | None = None,
) -> None:
    """Force-finish the running beams as they stand after step ``t`` (no EOS appended): at ``max_len``, or at the
    radix cap (``scores`` then are the next step's input rows, which ``row_map`` maps to step ``t``'s outputs)."""
    for row, raw in enumerate(scores.reshape(-1).tolist()):
        image = active[row // beam]
        if raw != NEG_INF and not done[image]:
            tokens, lps = pointers.trace(t, _out_row(row, row_map))
            finished[image].add(Hypothesis(tokens, penalty(raw, t + 1), lps, False))
