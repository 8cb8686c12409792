"""Training objectives, named by each model family's hooks (``FamilyHooks.objective``): teacher-forced
cross-entropy (autoregressive models) and LaBERT's masked-token objective (§3.2, Eq. 4).

An objective maps ``(model, visual batch, caption tokens)`` to ``(loss, nll)``; the loop owns everything else
(optimiser, clipping, checkpoints, validation). ``tokens`` are the loop's caption matrix (B·K, T):
``BOS w_1 … w_n EOS PAD …``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from edgecap.runtime.length import level_of
from edgecap.workshop.training.losses import label_smoothed_nll

__all__ = ["caption_levels", "cross_entropy", "level_inputs", "masked_lm", "objective_for"]

Objective = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def caption_levels(tokens: torch.Tensor, pad_id: int, levels: Any, tokens_per_word: int = 1) -> torch.Tensor:
    """(B,) 1-based length level of each caption row ``BOS … EOS PAD…`` (words = non-pad tokens − 2)."""
    words = (tokens.ne(pad_id).sum(dim=1) - 2).div(tokens_per_word, rounding_mode="floor").tolist()
    return torch.tensor([level_of(levels, int(n)) for n in words], dtype=torch.long, device=tokens.device)


def level_inputs(model: Any, tokens: torch.Tensor, pad_id: int, tokens_per_word: int = 1) -> dict[str, torch.Tensor]:
    """``{"length_level": each caption's ground-truth level}`` for a length-aware autoregressive model (LaBERT §3.1:
    trained at the level of the caption it reproduces), ``{}`` for the others: the keyword arguments of its
    ``decode_full`` beyond the tokens. Every teacher-forced trainer (frozen features, end-to-end) uses it."""
    levels = getattr(model, "length_levels", None)
    if not levels:
        return {}
    return {"length_level": caption_levels(tokens, pad_id, levels, tokens_per_word)}


def _autocast(visual: Any) -> contextlib.AbstractContextManager:
    return torch.autocast("cuda", dtype=torch.bfloat16) if visual.features.is_cuda else contextlib.nullcontext()


def cross_entropy(
    model: Any, visual: Any, tokens: torch.Tensor, pad_id: int, cfg: Any, tokens_per_word: int = 1
) -> tuple[torch.Tensor, ...]:
    """Teacher forcing (ACORT §5.1). A length-aware model gets each caption's ground-truth level (LaBERT §3.1);
    ``tokens_per_word`` converts token counts to words (radix digits per word)."""
    per_image = cfg.captions_per_image
    extra = level_inputs(model, tokens, pad_id, tokens_per_word)
    with _autocast(visual):
        memory = model.encode_memory(visual.features, visual.boxes, visual.mask)
        memory = memory.repeat_interleave(per_image, dim=0)
        mask = visual.mask.repeat_interleave(per_image, dim=0)
        logprobs = model.decode_full(memory, mask, tokens[:, :-1], **extra)
    return label_smoothed_nll(logprobs.float(), tokens[:, 1:], pad_id, cfg.label_smoothing)


def masked_lm(
    model: Any, visual: Any, tokens: torch.Tensor, pad_id: int, cfg: Any, tokens_per_word: int = 1
) -> tuple[torch.Tensor, ...]:
    """LaBERT's objective (§3.2): each caption padded with EOS to its level's ``L_high``, ``m ~ U[1, L_high]``
    random positions replaced by ``[MASK]``, label-smoothed cross-entropy over the masked positions only (Eq. 4).

    Rows are grouped by level so every forward pass has exactly the shape inference uses (no text padding mask).
    Captions longer than the last level are truncated to its ``L_high`` words.
    """
    if tokens_per_word != 1:
        raise ValueError("LaBERT predicts one word per position; train it with a word vocabulary")
    eos_id = _eos_of(tokens, pad_id)
    levels = model.levels
    row_levels = caption_levels(tokens, pad_id, levels)
    with _autocast(visual):
        state = model.encode(visual.features, visual.boxes, visual.mask)
    state = {k: v.repeat_interleave(cfg.captions_per_image, dim=0) for k, v in state.items()}
    total_loss = tokens.new_zeros((), dtype=torch.float32)
    total_nll = tokens.new_zeros((), dtype=torch.float32)
    count = 0
    for level in row_levels.unique().tolist():
        rows = row_levels.eq(level).nonzero().squeeze(1)
        high = levels[level - 1][1]
        words = tokens[rows, 1:]  # drop BOS
        target = torch.full((len(rows), high), eos_id, dtype=torch.long, device=tokens.device)
        width = min(high, words.shape[1])
        body = words[:, :width]
        target[:, :width] = torch.where(body.eq(pad_id), torch.full_like(body, eos_id), body)
        m = torch.randint(1, high + 1, (len(rows), 1), device=tokens.device)
        ranks = torch.rand(len(rows), high, device=tokens.device).argsort(dim=1).argsort(dim=1)
        masked = ranks < m  # m positions chosen uniformly without replacement
        inputs = target.masked_fill(masked, model.mask_id)
        level_t = torch.full((len(rows),), level, dtype=torch.long, device=tokens.device)
        with _autocast(visual):
            logprobs = model.refine(inputs, level_t, {k: v[rows] for k, v in state.items()}).float()
        nll = -logprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        smooth = -logprobs.mean(dim=-1)
        eps = cfg.label_smoothing
        total_loss = total_loss + (((1 - eps) * nll + eps * smooth) * masked).sum()
        total_nll = total_nll + (nll * masked).sum().detach()
        count += int(masked.sum())
    count = max(count, 1)
    return total_loss / count, total_nll / count


def _eos_of(tokens: torch.Tensor, pad_id: int) -> int:
    """The EOS id: the last non-pad token of a row (the loop's rows always end ``… EOS PAD…``)."""
    last = tokens.ne(pad_id).sum(dim=1)[0] - 1
    return int(tokens[0, last])


def objective_for(model: Any) -> Objective:
    """The objective of ``model``'s family: its :class:`~edgecap.workshop.models.FamilyHooks` ``objective``."""
    from edgecap.workshop.models import family_hooks

    return family_hooks(model).resolve("objective")
