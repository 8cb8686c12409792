"""The general beam selection of the vectorised beam search (:mod:`edgecap.runtime.decoding.beam`), for a step where
an EOS ranks within some image's top K: those images' top 2K, their finished hypotheses, and their next beams.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgecap.runtime.decoding._beam_finished import _Finished
from edgecap.runtime.decoding._beam_ranking import NEG_INF32, _arange, _column, _LogprobsAt, _Ranking
from edgecap.runtime.decoding.processors import LengthPenalty


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
