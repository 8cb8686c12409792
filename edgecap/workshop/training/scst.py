"""Self-critical sequence training (SCST): baselines, advantages and the policy-gradient loss.

SCST (Rennie et al., CVPR 2017) fine-tunes a cross-entropy captioner on its own samples: for K captions sampled per
image the loss is ``-(r - b) · log p(caption)``, r the caption's reward (CIDEr-D,
:mod:`edgecap.workshop.training.rewards`) and b a baseline that does not depend on the sample. Two baselines:

- ``"loo"`` (default): the leave-one-out mean of the image's other K - 1 sample rewards,
  ``b_j = (Σ_k r_k - r_j) / (K - 1)`` (ExpansionNet v2 §4.3 with K = 5; ACORT §5.1 with K = 15);
- ``"greedy"``: the reward of the image's greedy caption, decoded without gradient (the original SCST; ORT).

The loss is normalised either per sequence (ExpansionNet v2: the mean over (image, sample) of
``(r - b) · -Σ_t log p_t``) or per token (ACORT: ``-Σ log p_t · (r - b) · mask / Σ mask``); both include the EOS
token of a finished sample. This module is pure tensor arithmetic; :mod:`edgecap.workshop.training.scst_loop` samples,
scores and steps the optimiser.
"""

from __future__ import annotations

import torch

__all__ = ["BASELINES", "LOSS_NORMS", "advantages", "greedy_baseline", "leave_one_out_baseline", "scst_loss"]

BASELINES = ("loo", "greedy")
LOSS_NORMS = ("sequence", "token")


def leave_one_out_baseline(rewards: torch.Tensor) -> torch.Tensor:
    """(B, K) rewards -> (B, K) baselines: each sample's baseline is the mean reward of its image's other samples."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (images, samples), got shape {tuple(rewards.shape)}")
    k = rewards.shape[1]
    if k < 2:
        raise ValueError("the leave-one-out baseline needs at least 2 samples per image; use the greedy baseline")
    return (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)


def greedy_baseline(rewards: torch.Tensor, greedy_rewards: torch.Tensor) -> torch.Tensor:
    """(B, K) sample rewards and (B,) greedy-caption rewards -> (B, K) baselines (the greedy reward per image)."""
    if rewards.dim() != 2 or greedy_rewards.shape != rewards.shape[:1]:
        raise ValueError(
            f"expected rewards (B, K) and greedy rewards (B,), got {tuple(rewards.shape)} and "
            f"{tuple(greedy_rewards.shape)}"
        )
    return greedy_rewards[:, None].expand_as(rewards)


def advantages(rewards: torch.Tensor, baseline: str, greedy_rewards: torch.Tensor | None = None) -> torch.Tensor:
    """(B, K) ``r - b`` for the named baseline (``"loo"`` or ``"greedy"``, the latter needing ``greedy_rewards``)."""
    if baseline == "loo":
        return rewards - leave_one_out_baseline(rewards)
    if baseline == "greedy":
        if greedy_rewards is None:
            raise ValueError("the greedy baseline needs the greedy captions' rewards")
        return rewards - greedy_baseline(rewards, greedy_rewards)
    raise ValueError(f"unknown SCST baseline {baseline!r}; choose one of {BASELINES}")


def scst_loss(
    token_logprobs: torch.Tensor, mask: torch.Tensor, advantage: torch.Tensor, norm: str = "sequence"
) -> torch.Tensor:
    """The self-critical policy-gradient loss.

    Args:
        token_logprobs: (N, T) log-probability of each sampled token under the model (with gradient).
        mask: (N, T) bool, True on the sampled tokens (EOS included when the sample finished).
        advantage: (N,) ``r - b`` per sample, treated as a constant.
        norm: ``"sequence"`` (mean over samples of the summed log-probs) or ``"token"`` (mean over tokens).

    Returns:
        A scalar; minimising it raises the log-probability of samples with a positive advantage and lowers it for
        samples with a negative one.
    """
    if token_logprobs.shape != mask.shape or advantage.shape != token_logprobs.shape[:1]:
        raise ValueError(
            f"shapes differ: log-probs {tuple(token_logprobs.shape)}, mask {tuple(mask.shape)}, "
            f"advantage {tuple(advantage.shape)}"
        )
    weighted = token_logprobs * mask * advantage.detach().to(token_logprobs.dtype)[:, None]
    if norm == "sequence":
        return -weighted.sum() / max(token_logprobs.shape[0], 1)
    if norm == "token":
        return -weighted.sum() / mask.sum().clamp(min=1)
    raise ValueError(f"unknown SCST loss normalisation {norm!r}; choose one of {LOSS_NORMS}")
