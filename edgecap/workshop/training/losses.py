"""Caption losses over log-probabilities."""

from __future__ import annotations

import torch


def label_smoothed_nll(
    logprobs: torch.Tensor, targets: torch.Tensor, pad_id: int, smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean token loss ignoring padding.

    Args:
        logprobs: (B, T, V) log-probabilities.
        targets: (B, T) token ids; ``pad_id`` positions are ignored.
        smoothing: ε of label smoothing; the ε mass is spread uniformly over the vocabulary.

    Returns:
        (loss, nll): the smoothed loss to optimise and the plain NLL to log, both per non-pad token.
    """
    mask = targets.ne(pad_id)
    nll = -logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    tokens = mask.sum().clamp(min=1)
    nll_mean = (nll * mask).sum() / tokens
    if smoothing <= 0:
        return nll_mean, nll_mean.detach()
    uniform = -logprobs.mean(dim=-1)
    loss = (1.0 - smoothing) * nll + smoothing * uniform
    return (loss * mask).sum() / tokens, nll_mean.detach()
