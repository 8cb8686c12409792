"""Greedy decoding, and the row-wise loop greedy and sampling share.

Each row (one per image, or ``n`` per image when sampling) is an independent hypothesis. The first step runs on the
B encoded images only — all of an image's rows would see the same BOS — and the state is expanded to B·n rows after
it. A row that emits EOS is finished: with ``prune_finished`` it is dropped from the batch with ``select`` (fewer rows
per step); without it the row keeps being fed PAD at full batch size (fixed shapes) and its outputs are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from edgecap.decoding.config import DecodeCfg
from edgecap.decoding.processors import LogitsProcessor, StepContext, apply_processors, build_processors
from edgecap.decoding.protocol import Hypothesis, StepModel, batch_size_of, check_logprobs, device_of
from edgecap.decoding.search import GreedySearch, Search


@torch.inference_mode()
def decode_rows(
    step_model: StepModel,
    inputs: Mapping[str, Tensor],
    cfg: DecodeCfg,
    search: Search,
    rows_per_image: int = 1,
    processors: Sequence[LogitsProcessor] | None = None,
) -> list[list[Hypothesis]]:
    """Decode ``rows_per_image`` independent hypotheses per image, choosing each token with ``search`` (C = 1).

    Returns:
        For each of the B images, its ``rows_per_image`` hypotheses in row order; ``score`` is the sum of the
        per-token log-probs (EOS included when finished).
    """
    procs = build_processors(cfg) if processors is None else list(processors)
    state = step_model.encode(inputs)
    images = batch_size_of(state)
    device = device_of(state)
    total = images * rows_per_image

    tokens_out = torch.full((total, cfg.max_len), cfg.pad_id, dtype=torch.long, device=device)
    logprobs_out = torch.zeros(total, cfg.max_len, dtype=torch.float32, device=device)
    lengths = torch.full((total,), cfg.max_len, dtype=torch.long, device=device)  # tokens incl. EOS
    ended = torch.zeros(total, dtype=torch.bool, device=device)

    row_ids = torch.arange(total, device=device)  # output row of each live row
    live_tokens = torch.full((images,), cfg.bos_id, dtype=torch.long, device=device)
    history = torch.empty(images, 0, dtype=torch.long, device=device)
    scores = torch.zeros(images, device=device)
    for t in range(cfg.max_len):
        lp, state = step_model.step(live_tokens, state)
        lp = check_logprobs(lp.to(device), live_tokens.shape[0])
        if t == 0 and rows_per_image > 1:
            expand = torch.arange(images, device=device).repeat_interleave(rows_per_image)
            state = step_model.select(state, expand)
            lp, history, scores = lp[expand], history[expand], scores[expand]
        lp = apply_processors(procs, lp, StepContext(t, cfg.max_len, history))
        new_scores, tokens, _ = search.step(t, lp[:, None, :], scores[:, None])
        tokens, new_scores = tokens[:, 0], new_scores[:, 0]

        writable = ~ended[row_ids]
        rows = row_ids[writable]
        tokens_out[rows, t] = tokens[writable]
        logprobs_out[rows, t] = lp.gather(1, tokens[:, None])[:, 0][writable]
        is_eos = tokens.eq(cfg.eos_id) & writable
        lengths[row_ids[is_eos]] = t + 1
        ended[row_ids[is_eos]] = True

        if t == cfg.max_len - 1 or bool(ended.all()):
            break
        history = torch.cat([history, tokens[:, None]], dim=1)
        scores = new_scores
        if cfg.prune_finished:
            if bool(is_eos.any()):
                keep = (~is_eos).nonzero().squeeze(1)
                state = step_model.select(state, keep)
                row_ids, history, scores, tokens = row_ids[keep], history[keep], scores[keep], tokens[keep]
            live_tokens = tokens
        else:
            live_tokens = torch.where(ended[row_ids], torch.full_like(tokens, cfg.pad_id), tokens)

    return _collect(tokens_out, logprobs_out, lengths, ended, images, rows_per_image)


def _collect(
    tokens: Tensor, logprobs: Tensor, lengths: Tensor, ended: Tensor, images: int, rows_per_image: int
) -> list[list[Hypothesis]]:
    tokens_l, logprobs_l = tokens.cpu().tolist(), logprobs.cpu().tolist()
    lengths_l, ended_l = lengths.cpu().tolist(), ended.cpu().tolist()
    out: list[list[Hypothesis]] = []
    for image in range(images):
        hyps = []
        for row in range(image * rows_per_image, (image + 1) * rows_per_image):
            n, fin = lengths_l[row], ended_l[row]
            lps = logprobs_l[row][:n]
            hyps.append(Hypothesis(tokens_l[row][: n - 1 if fin else n], float(sum(lps)), lps, fin))
        out.append(hyps)
    return out


def greedy(
    step_model: StepModel,
    inputs: Mapping[str, Tensor],
    cfg: DecodeCfg,
    processors: Sequence[LogitsProcessor] | None = None,
) -> list[list[Hypothesis]]:
    """Greedy decoding: the most likely token at every step.

    Args:
        step_model: any :class:`StepModel`.
        inputs: encoder inputs with batch B.
        cfg: token ids, ``max_len``, ``min_len``, processors, ``prune_finished``.
        processors: replaces the processors ``cfg`` would build.

    Returns:
        B lists of one :class:`Hypothesis` each.
    """
    return decode_rows(step_model, inputs, cfg, GreedySearch(), 1, processors)
