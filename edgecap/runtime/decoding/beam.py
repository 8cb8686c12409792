"""Batched beam search: B images × K beams in one (B·K, V) array, batch-major (beams of an image are contiguous).

Follows the ACORT/ORT reference design (self-critical.pytorch ``batch_beam_search``) with
fairseq's 2K-candidate trick:

- **Step 0** feeds BOS once per image (B rows), so the K beams start from K *different* tokens; the state is expanded
  to B·K by the same ``select`` that later reorders beams.
- **Each step** adds the (processed) log-probs to the running sums and takes the top 2K of the K·V continuations per
  image (:class:`~edgecap.runtime.decoding.search.BeamSearch`). An EOS candidate ranked within the top K finishes: its
  hypothesis moves to the image's finished list (at most K kept, best first, scored with the length penalty). The K
  best non-EOS candidates become the running beams, so K beams stay alive while others finish.
- **Stopping rule** per image: done when it holds K finished hypotheses and no running beam can still beat the worst
  of them. Log-probs are <= 0, so a running sum only falls; its best reachable score is the bound of
  :meth:`LengthPenalty.upper_bound` (without a length penalty, simply its current sum). Done, too, when every running
  beam is dead (``-inf``). At ``max_len`` the running beams are force-finished (``finished=False``, no EOS appended),
  as the reference does at ``seq_length``.
- **Pruning**: with ``cfg.prune_finished`` a done image's K rows leave the batch in the same ``select`` that reorders
  the beams, so later steps run on fewer rows. Without it every step runs at B·K rows (fixed shapes for exported
  graphs) and done images are only ignored.

Scores are raw sums of log-probs unless ``cfg.length_penalty`` is set; ranking of running beams always uses the raw
sums (the penalty only compares finished hypotheses, as in the reference and fairseq).

Cost per step. The search runs on the host for every runtime, so its work per step must stay a fixed number of numpy
ops whatever the batch: nothing loops over images in Python while decoding. Those ops cost about 1 µs each even on
tiny arrays, more than per-image Python lists cost for a few images, so batches of up to :data:`SMALL_BATCH` images
run the same search image by image (:mod:`edgecap.runtime.decoding._beam_rows`; same hypotheses, bit for bit).

- The step's log-probs are added to the running sums and ranked in one reused buffer (:class:`_Ranking`). Where the
  processors of a step fold into one static mask (:class:`~edgecap.runtime.decoding.processors.ProcessorPlan`), masking
  costs less than a masked copy: with few allowed tokens (a radix word boundary) only their columns are summed and
  ranked; with few banned ones, the plain sum with the banned columns redone. A candidate's log-prob is read back
  from the model's row at its token (the same bits exact masking gives).
- Candidates are picked best first by repeated ``argmax`` in place, the picks restored afterwards
  (:func:`_top_k`): first the top K only. When no EOS ranks within any image's top K — most steps — they are the
  running beams as they stand. Otherwise only the images where an EOS ranks get their top 2K and the general
  selection (:func:`_select_with_eos`), vectorised over those images.
- Finished hypotheses are kept as one (images, K, 5) array of scores and back-pointer positions, merged by one
  stable sort per step that finishes any (:class:`_Finished`); the stopping rule is one vectorised comparison.
- Tokens are not gathered into growing (B·K, t) sequences: each step stores its back-pointers (token, log-prob,
  parent row) as arrays, and only the returned ``n_best`` hypotheses are traced, all at once, at the end. The
  (B·K, t) history is built only when a processor reads it (n-gram blocking, a multi-digit radix constraint).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgecap.runtime.decoding._beam_rows import beam_search_rows
from edgecap.runtime.decoding.config import DecodeCfg, DecodeCfgError
from edgecap.runtime.decoding.processors import LengthPenalty, LogitsProcessor, MaskColumns, processor_plan
from edgecap.runtime.decoding.protocol import DecodeInputError, Hypothesis, StepModel, as_logprobs, batch_size_of
from edgecap.runtime.decoding.search import ranked

NEG_INF = float("-inf")
NEG_INF32 = np.float32(NEG_INF)
_MAX_RUNS = 8  # a static mask's columns as at most this many slices; more: one fancy-indexed gather
# : Batches of at most this many images run the per-image form (:mod:`edgecap.runtime.decoding._beam_rows`), cheaper
# there.
SMALL_BATCH = 16


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
    if beam < 1:
        raise DecodeCfgError(f"beam_size must be >= 1, got {beam}")

    state = step_model.encode(inputs)
    images = batch_size_of(state)
    if images <= SMALL_BATCH:
        return beam_search_rows(step_model, state, images, cfg, procs)
    finished = _Finished(images, beam)
    done = np.zeros(images, dtype=bool)
    active = _arange(images)  # image of each group of rows in the batch
    pointers = _BackPointers()
    row_map: np.ndarray | None = None  # input rows of this step -> output rows of the previous one (None: identity)
    plan = None
    vocab = 0
    buffer = np.empty(0, dtype=np.float32)

    k = 1  # live beams per image: 1 at step 0, K afterwards
    live_tokens = np.full(images, cfg.bos_id, dtype=np.int64)
    scores = np.zeros((images, 1, 1), dtype=np.float32)  # (groups, k, 1) running sums
    history = np.empty((images, 0), dtype=np.int64)  # (rows, t), kept only if a processor reads it

    for t in range(max_len):
        groups = active.shape[0]
        raw, state = step_model.step(live_tokens, state)
        raw = as_logprobs(raw, groups * k)
        if plan is None:
            vocab = raw.shape[1]
            plan = processor_plan(cfg, procs, vocab)
            buffer = np.empty(images * beam * vocab, dtype=np.float32)
        elif raw.shape[1] != vocab:
            raise DecodeInputError(f"step {t} returned {raw.shape[1]} classes, earlier steps {vocab}")
        width = min(2 * beam, k * vocab)  # C candidates per group
        first = min(beam, width)  # picked first: enough when no EOS ranks within them
        bias = plan.bias(t)
        source = raw if bias is not None else plan(raw, t, history)
        ranking = _Ranking(buffer, source, scores, bias, plan.mask_columns(t), width)
        vals, flat = ranking.top(first)
        if ranking.exact_needed and np.isnan(vals).any():  # a NaN/+inf under a mask: redo with exact masking
            bias, source = None, plan(raw, t, history)
            ranking = _Ranking(buffer, source, scores, None, None, width)
            vals, flat = ranking.top(first)
        logprob_at = _LogprobsAt(source, bias, k, vocab)
        group_col = _column(groups, 1)
        tokens = flat % vocab
        src = flat // vocab + _column(groups, k)  # each candidate's parent, as an input row of this step
        is_eos = tokens == eos
        if first == beam and not is_eos.any():  # no EOS within any image's top K: the K best run on
            next_scores, lps = vals, logprob_at(flat, group_col)
        else:
            step = _StepCandidates(t, k, vocab, first, width, ranking, vals, flat, is_eos, tokens, src, logprob_at)
            search = _SearchState(beam, cfg.pad_id, eos, penalty, active, done, finished, row_map)
            tokens, src, next_scores, lps = _select_with_eos(step, search)
        tokens, src = tokens.reshape(-1), src.reshape(-1)
        pointers.append(tokens, lps.reshape(-1), src if row_map is None else row_map[src])

        live = ~done[active]
        if t == max_len - 1:  # force-finish the running beams (no EOS appended)
            valid = (next_scores != NEG_INF32) & live[:, None]
            if valid.any():
                rows = np.flatnonzero(valid.any(axis=1))
                score = next_scores[rows].astype(np.float64) / penalty.divisor(t + 1)
                out_rows = rows[:, None] * beam + _arange(beam)
                finished.add(active[rows], valid[rows], score, t, out_rows, 0.0, False)
            break
        best = next_scores[:, 0].astype(np.float64)
        if penalty.active:  # LengthPenalty.upper_bound, vectorised
            ends = (penalty.divisor(t + 2), penalty.divisor(max_len))
            bound = np.where(best <= 0, best / max(ends), best / min(ends))
            bound[best == NEG_INF] = NEG_INF
        else:
            bound = best
        newly = live & ((bound == NEG_INF) | (finished.full(active) & (bound <= finished.worst(active))))
        if newly.any():
            done[active[newly]] = True
            if done.all():
                break

        row_map = None
        if newly.any() and cfg.prune_finished:
            keep = np.flatnonzero(~newly)
            row_map = (keep[:, None] * beam + _arange(beam)).reshape(-1)
            src, tokens = src[row_map], tokens[row_map]
            next_scores = next_scores[keep]
            active = active[keep]
        scores = next_scores[:, :, None]
        live_tokens = tokens
        rows = src.shape[0]
        if rows != groups * k or not np.array_equal(src, _arange(rows)):  # each beam continuing itself: no gather
            state = step_model.select(state, src)
            if plan.needs_history:
                history = history[src]
        if plan.needs_history:
            history = np.concatenate([history, live_tokens[:, None]], axis=1)
        k = beam

    return finished.hypotheses(cfg.n_best, pointers)


@dataclass(frozen=True, slots=True)
class _StepCandidates:
    """One step's shape (step ``t``, ``k`` live beams per group, ``vocab`` classes, ``first``/``width`` candidates per
    group) and its top ``first`` candidates: scores, flat indices into ``k * vocab``, EOS flags, tokens, parent rows."""

    t: int
    k: int
    vocab: int
    first: int
    width: int
    ranking: _Ranking
    vals: np.ndarray
    flat: np.ndarray
    is_eos: np.ndarray
    tokens: np.ndarray
    src: np.ndarray
    logprob_at: _LogprobsAt


@dataclass(frozen=True, slots=True)
class _SearchState:
    """What the selection reads and updates across steps: the image of each group (``active``), which images are
    done, their finished hypotheses, and how this step's input rows map to the previous step's outputs."""

    beam: int
    pad_id: int
    eos_id: int
    penalty: LengthPenalty
    active: np.ndarray
    done: np.ndarray
    finished: _Finished
    row_map: np.ndarray | None


def _select_with_eos(
    step: _StepCandidates, search: _SearchState
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The general selection, for a step where some EOS ranks within an image's top K; vectorised over just those
    images (the others keep their top K).

    Per image: EOS candidates ranked within the top K with a finite score finish (in rank order, unless the image is
    done); the running beams are the non-EOS candidates in rank order, then EOS ones (dead), then padding (dead) if
    fewer than K candidates exist.

    Returns:
        The next beams of every group, (groups, K) each: tokens, source input rows, scores, log-probs.
    """
    t, k, vocab, first, width = step.t, step.k, step.vocab, step.first, step.width
    ranking, vals, flat, is_eos, tokens, src = step.ranking, step.vals, step.flat, step.is_eos, step.tokens, step.src
    logprob_at = step.logprob_at
    beam, pad_id, eos_id, penalty = search.beam, search.pad_id, search.eos_id, search.penalty
    active, done, finished, row_map = search.active, search.done, search.finished, search.row_map
    groups = vals.shape[0]
    if first == beam:
        sel = np.flatnonzero(is_eos.any(axis=1))
        next_tokens, next_src, next_scores = tokens, src, vals.copy()
        lps = logprob_at(flat, _column(groups, 1))
    else:  # fewer than K candidates per group (tiny vocabulary at step 0): every group
        sel = _arange(groups)
    sel_col = sel[:, None]
    if width > first:  # the top 2K of the selected groups (the first K again, then the next K)
        s_vals, s_flat = ranking.top(width, sel)
    else:
        s_vals, s_flat = vals[sel], flat[sel]
    s_eos = s_flat % vocab == eos_id
    order = np.argsort(s_eos, axis=1, kind="stable")[:, :beam]  # non-EOS in rank order, then EOS
    at = (_column(sel.shape[0], 1), order)
    pick = s_flat[at]
    c_tokens = pick % vocab
    c_src = pick // vocab + sel_col * k
    c_scores = np.where(s_eos[at], NEG_INF32, s_vals[at])
    c_lps = logprob_at(pick, sel_col)
    if pick.shape[1] < beam:  # fewer than K candidates exist: dead padding beams
        pad = beam - pick.shape[1]
        n = sel.shape[0]
        c_tokens = np.concatenate([c_tokens, np.full((n, pad), pad_id, dtype=np.int64)], axis=1)
        c_src = np.concatenate([c_src, np.repeat(c_src[:, :1], pad, axis=1)], axis=1)
        c_scores = np.concatenate([c_scores, np.full((n, pad), NEG_INF32)], axis=1)
        c_lps = np.concatenate([c_lps, np.full((n, pad), NEG_INF32)], axis=1)

    ranked_k = min(beam, s_flat.shape[1])
    fin = s_eos[:, :ranked_k] & np.isfinite(s_vals[:, :ranked_k]) & ~done[active[sel]][:, None]
    if fin.any():
        rows = np.flatnonzero(fin.any(axis=1))
        f_flat = s_flat[rows, :ranked_k]
        parents = f_flat // vocab + sel_col[rows] * k
        score = s_vals[rows, :ranked_k].astype(np.float64) / penalty.divisor(t + 1)
        out_rows = parents if row_map is None else row_map[parents]
        eos_lp = logprob_at(f_flat, sel_col[rows])
        finished.add(active[sel[rows]], fin[rows], score, t - 1, out_rows, eos_lp, True)

    if first < beam:
        return c_tokens, c_src, c_scores, c_lps
    next_tokens[sel], next_src[sel], next_scores[sel], lps[sel] = c_tokens, c_src, c_scores, c_lps
    return next_tokens, next_src, next_scores, lps
