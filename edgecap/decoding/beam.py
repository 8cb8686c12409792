"""Batched beam search: B images × K beams in one (B·K, V) tensor, batch-major (beams of an image are contiguous).

Follows the ACORT/ORT reference design (self-critical.pytorch ``batch_beam_search``; reference-code notes §1.4) with
fairseq's 2K-candidate trick:

- **Step 0** feeds BOS once per image (B rows), so the K beams start from K *different* tokens; the state is expanded
  to B·K by the same ``select`` that later reorders beams.
- **Each step** adds the (processed) log-probs to the running sums and takes the top 2K of the K·V continuations per
  image (:class:`~edgecap.decoding.search.BeamSearch`). An EOS candidate ranked within the top K finishes: its
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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from edgecap.decoding.config import DecodeCfg
from edgecap.decoding.processors import LengthPenalty, LogitsProcessor, StepContext, apply_processors, build_processors
from edgecap.decoding.protocol import Hypothesis, StepModel, batch_size_of, check_logprobs, device_of
from edgecap.decoding.search import BeamSearch

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


@torch.inference_mode()
def beam_search(
    step_model: StepModel,
    inputs: Mapping[str, Tensor],
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
    procs = build_processors(cfg) if processors is None else list(processors)
    beam = cfg.beam_size
    penalty = LengthPenalty(cfg.length_penalty, cfg.length_penalty_alpha)
    search = BeamSearch(beam)

    state = step_model.encode(inputs)
    images = batch_size_of(state)
    device = device_of(state)
    finished = [_Finished(beam) for _ in range(images)]
    done = [False] * images
    active = list(range(images))  # image of each group of rows in the batch

    k = 1  # live beams per image: 1 at step 0, K afterwards
    live_tokens = torch.full((images,), cfg.bos_id, dtype=torch.long, device=device)
    seqs = torch.empty(images, 0, dtype=torch.long, device=device)  # (n·k, t)
    seq_lps = torch.empty(images, 0, dtype=torch.float32, device=device)
    scores = torch.zeros(images, device=device)

    for t in range(cfg.max_len):
        groups = len(active)
        lp, state = step_model.step(live_tokens, state)
        lp = check_logprobs(lp.to(device), groups * k)
        lp = apply_processors(procs, lp, StepContext(t, cfg.max_len, seqs))
        vocab = lp.shape[1]

        cand_scores, cand_tokens, cand_beams = search.step(t, lp.view(groups, k, vocab), scores.view(groups, k))
        n_cand = cand_scores.shape[1]
        cand_lps = lp.view(groups, k * vocab).gather(1, cand_beams * vocab + cand_tokens)
        is_eos = cand_tokens.eq(cfg.eos_id)
        rank = torch.arange(n_cand, device=device).expand(groups, n_cand)
        to_finish = is_eos & (rank < beam) & torch.isfinite(cand_scores)

        # The K best non-EOS candidates continue (EOS ones sort last and, if picked at all, are dead).
        order = torch.where(is_eos, rank + n_cand, rank).argsort(dim=1)[:, :beam]
        next_scores = cand_scores.gather(1, order).masked_fill(is_eos.gather(1, order), NEG_INF)
        next_tokens, next_lps = cand_tokens.gather(1, order), cand_lps.gather(1, order)
        src = (torch.arange(groups, device=device) * k)[:, None] + cand_beams.gather(1, order)
        if order.shape[1] < beam:  # fewer than K candidates exist (tiny vocabulary): pad with dead beams
            pad = beam - order.shape[1]
            next_scores = torch.cat([next_scores, next_scores.new_full((groups, pad), NEG_INF)], 1)
            next_tokens = torch.cat([next_tokens, next_tokens.new_full((groups, pad), cfg.pad_id)], 1)
            next_lps = torch.cat([next_lps, next_lps.new_full((groups, pad), NEG_INF)], 1)
            src = torch.cat([src, src[:, :1].expand(groups, pad)], 1)
        src = src.reshape(-1)

        _finish_eos(to_finish, cand_beams, cand_scores, cand_lps, seqs, seq_lps, k, t, active, done, finished, penalty)
        seqs = torch.cat([seqs.index_select(0, src), next_tokens.reshape(-1, 1)], dim=1)
        seq_lps = torch.cat([seq_lps.index_select(0, src), next_lps.reshape(-1, 1)], dim=1)
        next_scores = next_scores.reshape(-1)

        if t == cfg.max_len - 1:
            _finish_running(next_scores, seqs, seq_lps, beam, active, done, finished, penalty)
            break
        best_running = next_scores.view(groups, beam).max(dim=1).values.tolist()
        for g, image in enumerate(active):
            if done[image]:
                continue
            bound = penalty.upper_bound(best_running[g], t + 2, cfg.max_len)
            if bound == NEG_INF or (finished[image].full and bound <= finished[image].worst):
                done[image] = True
        if all(done):
            break

        keep = [g for g, image in enumerate(active) if not done[image]] if cfg.prune_finished else list(range(groups))
        if len(keep) < groups:
            rows = (torch.tensor(keep, device=device)[:, None] * beam + torch.arange(beam, device=device)).reshape(-1)
            src, seqs, seq_lps = src[rows], seqs[rows], seq_lps[rows]
            next_scores, next_tokens = next_scores[rows], next_tokens.reshape(-1)[rows]
            active = [active[g] for g in keep]
        state = step_model.select(state, src)
        live_tokens, scores, k = next_tokens.reshape(-1), next_scores, beam

    return [f.items[: cfg.n_best] for f in finished]


def _finish_eos(
    to_finish: Tensor,
    cand_beams: Tensor,
    cand_scores: Tensor,
    cand_lps: Tensor,
    seqs: Tensor,
    seq_lps: Tensor,
    k: int,
    t: int,
    active: list[int],
    done: list[bool],
    finished: list[_Finished],
    penalty: LengthPenalty,
) -> None:
    """Move the EOS candidates of this step into their images' finished lists (one host transfer)."""
    where = to_finish.nonzero()
    if where.numel() == 0:
        return
    groups, cols = where[:, 0], where[:, 1]
    src = groups * k + cand_beams[groups, cols]
    prefixes, prefix_lps = seqs[src].tolist(), seq_lps[src].tolist()
    eos_lps, raws = cand_lps[groups, cols].tolist(), cand_scores[groups, cols].tolist()
    for g, prefix, lps, eos_lp, raw in zip(groups.tolist(), prefixes, prefix_lps, eos_lps, raws, strict=True):
        image = active[g]
        if not done[image]:
            finished[image].add(Hypothesis(prefix, penalty(raw, t + 1), [*lps, eos_lp], True))


def _finish_running(
    scores: Tensor,
    seqs: Tensor,
    seq_lps: Tensor,
    beam: int,
    active: list[int],
    done: list[bool],
    finished: list[_Finished],
    penalty: LengthPenalty,
) -> None:
    """Force-finish the running beams at ``max_len`` (no EOS appended)."""
    length = seqs.shape[1]
    for row, (raw, tokens, lps) in enumerate(zip(scores.tolist(), seqs.tolist(), seq_lps.tolist(), strict=True)):
        image = active[row // beam]
        if raw != NEG_INF and not done[image]:
            finished[image].add(Hypothesis(tokens, penalty(raw, length), lps, False))
