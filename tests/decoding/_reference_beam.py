"""A frozen copy of the numpy beam search as it was before the batch-scaling work (per-image Python lists, one
``_Finished`` list per image, back-pointers traced per hypothesis), kept as the slow reference the vectorised search
must match bit for bit (``test_beam_equivalence.py``). Test-only: nothing in ``edgecap`` imports it.

Its candidate picker (``top_candidates`` by repeated ``argmax``) is frozen here too, with one fix made since: at
batch 1 it told that ``-inf`` was reached from the picked values of the *unlowered* totals, so a NaN pick picked
again (a NaN running sum with fewer than 2K other finite continuations) went unnoticed and the candidates repeated;
it now reads the scratch value, as the batched form always did. Data types that did not change (``DecodeCfg``,
``Hypothesis``, ``LengthPenalty``, the processor plan) come from the package.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgecap.decoding.config import DecodeCfg, DecodeCfgError
from edgecap.decoding.processors import LengthPenalty, LogitsProcessor, processor_plan
from edgecap.decoding.protocol import Hypothesis, StepModel, as_logprobs, batch_size_of
from edgecap.decoding.search import ranked

NEG_INF = float("-inf")
NEG_INF32 = np.float32(-np.inf)


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
            array, width = self._lps[s]  # type: ignore[misc]
            self._lps[s] = array[:, :width].ravel().tolist()

    def trace(self, t: int, row: int) -> tuple[list[int], list[float]]:
        """Tokens and log-probs of output row ``row`` of step ``t``, from step 0 (``t = -1``: empty)."""
        if self._unread and self._unread[0] <= t:
            self._read(t)
        tokens, lps = [], []
        all_tokens, all_lps, all_parents = self._tokens, self._lps, self._parents
        for s in range(t, -1, -1):
            tokens.append(all_tokens[s][row])
            lps.append(all_lps[s][row])  # type: ignore[index]  # a list: read above
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


def beam_search(
    step_model: StepModel,
    inputs: Mapping[str, Any],
    cfg: DecodeCfg,
    processors: Sequence[LogitsProcessor] | None = None,
) -> list[list[Hypothesis]]:
    """Beam search over a batch of images (see the module docstring for the exact rules).

    Args:
        step_model: any :class:`StepModel`.
        inputs: encoder inputs with batch B.
        cfg: ``beam_size`` K, ``n_best``, ``max_len``, ``length_penalty``/``length_penalty_alpha``, processor options,
            ``prune_finished``.
        processors: replaces the processors ``cfg`` would build.

    Returns:
        For each of the B images, its ``n_best`` best hypotheses, best first (fewer only if the processors leave fewer
        legal sequences).
    """
    procs = None if processors is None else list(processors)
    beam, eos, max_len = cfg.beam_size, cfg.eos_id, cfg.max_len
    penalty = LengthPenalty(cfg.length_penalty, cfg.length_penalty_alpha)
    bounded = penalty.active  # without a penalty a running beam's bound is its current sum
    if beam < 1:
        raise DecodeCfgError(f"beam_size must be >= 1, got {beam}")

    state = step_model.encode(inputs)
    images = batch_size_of(state)
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
            tokens_h, src_h, scores_h, lps_h, best = _select_with_eos(
                flat.tolist(), cand_scores.tolist(), lp2[rows, flat].tolist(), vocab, k, beam,
                cfg.pad_id, eos, t, active, done, finished, penalty, pointers, row_map,
            )  # fmt: skip
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


def _select_with_eos(
    flat: list[list[int]],
    cand_scores: list[list[float]],
    cand_lps: list[list[float]],
    vocab: int,
    k: int,
    beam: int,
    pad_id: int,
    eos_id: int,
    t: int,
    active: list[int],
    done: list[bool],
    finished: list[_Finished],
    penalty: LengthPenalty,
    pointers: _BackPointers,
    row_map: list[int] | None,
) -> tuple[list[int], list[int], list[float], list[float], list[float]]:
    """The general selection, on the host, for a step where some EOS ranks within an image's top K.

    Per image: EOS candidates ranked within the top K with a finite score finish (in rank order, unless the image is
    done); the running beams are the non-EOS candidates in rank order, then EOS ones (dead), then padding (dead) if
    fewer than K candidates exist.

    Returns:
        The next beams (tokens, source input rows, scores, log-probs; K per image, image-major) and each image's
        best running score.
    """
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
) -> None:
    """Force-finish the running beams at ``max_len`` (no EOS appended)."""
    for row, raw in enumerate(scores.reshape(-1).tolist()):
        image = active[row // beam]
        if raw != NEG_INF and not done[image]:
            tokens, lps = pointers.trace(t, row)
            finished[image].add(Hypothesis(tokens, penalty(raw, t + 1), lps, False))


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
    rows = np.arange(groups)
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
