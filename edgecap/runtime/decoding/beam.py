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
- **The radix cap**: a step where the processors leave EOS the only legal token (no whole word fits before
  ``max_len``: ACORT's 27th token, after 13 two-digit words) is not run. The running beams finish there as they stand
  (``finished=False``), scored by their accumulated log-probs, as the reference takes its unfinished beams at
  ``seq_length`` (26 tokens); scoring the forced EOS instead would let an unfinished caption lose to a short one
  whenever EOS is unlikely after 13 words.
- **Pruning**: with ``cfg.prune_finished`` a done image's K rows leave the batch in the same ``select`` that reorders
  the beams, so later steps run on fewer rows. Without it every step runs at B·K rows (fixed shapes for exported
  graphs) and done images are only ignored.

Scores are raw sums of log-probs unless ``cfg.length_penalty`` is set; ranking of running beams always uses the raw
sums (the penalty only compares finished hypotheses, as in the reference and fairseq).

Cost per step. The search runs on the host for every runtime, so its work per step must stay a fixed number of numpy
ops whatever the batch: nothing loops over images in Python while decoding. Those ops cost about 1 µs each even on
tiny arrays, more than per-image Python lists cost for a few images, so batches of up to :data:`SMALL_BATCH` images
run the same search image by image (:mod:`edgecap.runtime.decoding._beam_rows`; same hypotheses, bit for bit).

- The step's log-probs are added to the running sums and ranked in one reused buffer
  (:class:`~edgecap.runtime.decoding._beam_ranking._Ranking`). Where the processors of a step fold into one static mask
  (:class:`~edgecap.runtime.decoding.processors.ProcessorPlan`), masking costs less than a masked copy: with few allowed
  tokens (a radix word boundary) only their columns are summed and ranked; with few banned ones, the plain sum with the
  banned columns redone. A candidate's log-prob is read back from the model's row at its token (the same bits exact
  masking gives).
- Candidates are picked best first by repeated ``argmax`` in place, the picks restored afterwards
  (:func:`~edgecap.runtime.decoding._beam_ranking._top_k`): first the top K only. When no EOS ranks within any image's
  top K — most steps — they are the running beams as they stand. Otherwise only the images where an EOS ranks get their
  top 2K and the general selection (:func:`~edgecap.runtime.decoding._beam_select._select_with_eos`), vectorised over
  those images.
- Finished hypotheses are kept as one (images, K, 5) array of scores and back-pointer positions, merged by one stable
  sort per step that finishes any (:class:`~edgecap.runtime.decoding._beam_finished._Finished`); the stopping rule is
  one vectorised comparison.
- Tokens are not gathered into growing (B·K, t) sequences: each step stores its back-pointers (token, log-prob, parent
  row) as arrays, and only the returned ``n_best`` hypotheses are traced, all at once, at the end. The (B·K, t) history
  is built only when a processor reads it (n-gram blocking, a multi-digit radix constraint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgecap.runtime.decoding._beam_finished import _BackPointers, _Finished
from edgecap.runtime.decoding._beam_ranking import NEG_INF, NEG_INF32, _arange, _column, _LogprobsAt, _Ranking
from edgecap.runtime.decoding._beam_rows import beam_search_rows
from edgecap.runtime.decoding._beam_select import _SearchState, _select_with_eos, _StepCandidates
from edgecap.runtime.decoding.config import DecodeCfg, DecodeCfgError
from edgecap.runtime.decoding.processors import LengthPenalty, LogitsProcessor, processor_plan
from edgecap.runtime.decoding.protocol import DecodeInputError, Hypothesis, StepModel, as_logprobs, batch_size_of

__all__ = ["NEG_INF", "NEG_INF32", "SMALL_BATCH", "beam_search"]

# : Batches of at most this many images run the per-image form (:mod:`edgecap.runtime.decoding._beam_rows`), cheaper
# there.
SMALL_BATCH = 16


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
        if plan is not None and plan.only_token(t) == eos:  # the radix cap: take the running beams as they stand
            _finish_at_cap(finished, scores[:, :, 0], ~done[active], active, row_map, t, penalty)
            break
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


def _finish_at_cap(
    finished: _Finished,
    scores: np.ndarray,
    live: np.ndarray,
    active: np.ndarray,
    row_map: np.ndarray | None,
    t: int,
    penalty: LengthPenalty,
) -> None:
    """Finish the running beams that enter step ``t`` unchanged (``finished=False``, the ``t`` tokens they hold):
    ``scores`` (groups, K) are their sums, ``live`` which groups' images are not done yet."""
    valid = (scores != NEG_INF32) & live[:, None]
    if not valid.any():
        return
    groups, k = scores.shape
    rows = np.flatnonzero(valid.any(axis=1))
    out_rows = (_arange(groups * k) if row_map is None else row_map).reshape(groups, k)
    score = scores[rows].astype(np.float64) / penalty.divisor(t)
    finished.add(active[rows], valid[rows], score, t - 1, out_rows[rows], 0.0, False)
