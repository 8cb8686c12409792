"""One SCST step's two halves: :func:`rollout` samples K captions per image without gradient and scores them;
:func:`scst_objective` is the teacher-forced pass with gradient over those samples (steps 1-3 of
:mod:`edgecap.workshop.training.scst_loop`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from edgecap.workshop.training.config import TrainCfg
from edgecap.workshop.training.objectives import _autocast
from edgecap.workshop.training.rewards import CaptionReward
from edgecap.workshop.training.scst import advantages, scst_loss

__all__ = ["Rollout", "batch_seed", "rollout", "scst_objective", "target_levels"]


@dataclasses.dataclass
class Rollout:
    """One batch's samples as the teacher-forced pass needs them, and their rewards (for logging)."""

    inputs: torch.Tensor  # (B·K, T) BOS + sample without its last token
    targets: torch.Tensor  # (B·K, T) the sample + EOS when finished, PAD after
    mask: torch.Tensor  # (B·K, T) bool, True on scored tokens
    advantage: torch.Tensor  # (B·K,)
    rewards: np.ndarray  # (B, K)
    captions: list[str]  # the first sample of each image


def batch_seed(seed: int, epoch: int, batch: int, rank: int) -> int:
    """The sampling seed of one batch on one rank: repeatable after a resume, different across ranks."""
    return int(np.random.SeedSequence([seed, epoch, batch, rank]).generate_state(1)[0])


def target_levels(model: Any, captions: list[Any], seed: int) -> torch.Tensor | None:
    """(B,) the length level of one reference caption drawn per image, for a ``*-len`` model; None otherwise."""
    from edgecap.runtime.length import level_of

    levels = getattr(model, "length_levels", None)
    if not levels:
        return None
    gen = torch.Generator().manual_seed(seed)
    picks = [caps[int(torch.randint(len(caps), (1,), generator=gen))] for caps in captions]
    return torch.tensor([level_of(levels, len(words)) for words in picks], dtype=torch.long)


def rollout(
    model: Any,
    visual: Any,
    refs: list[list[list[str]]],
    vocab: Any,
    cfg: TrainCfg,
    reward: CaptionReward,
    seed: int,
    levels: torch.Tensor | None = None,
) -> Rollout:
    """Sample ``cfg.scst_samples`` captions per image without gradient, score them, and build the teacher-forcing
    tensors. ``refs[i]`` are image i's references in reward form (:meth:`CaptionReward.references`)."""
    from edgecap.runtime.decoding import DecodeCfg, decode
    from edgecap.runtime.decoding.protocol import stack_hypotheses
    from edgecap.runtime.decoding.sampling import sample
    from edgecap.workshop.torch_runtime.runtime import TorchStepModel

    k = cfg.scst_samples
    device = visual.features.device
    max_len = cfg.scst_max_words * vocab.tokens_per_word + 1
    inputs = visual.as_inputs()
    if levels is not None:
        inputs = {**inputs, "length_level": levels.numpy()}
    was_training = model.training
    step_model = TorchStepModel(model, device=device)  # eval mode, inference_mode
    try:
        dcfg = DecodeCfg.for_vocab(vocab, strategy="sample", num_samples=k, seed=seed, max_len=max_len)
        samples = sample(step_model, inputs, dcfg)
        greedy = None
        if cfg.scst_baseline == "greedy":
            greedy = decode(step_model, inputs, DecodeCfg.for_vocab(vocab, strategy="greedy", max_len=max_len))
    finally:
        model.train(was_training)
    flat = [h for hyps in samples for h in hyps]
    cands = [reward.candidate(vocab.decode(h.tokens), h.finished) for h in flat]
    rows = [refs[i] for i in range(len(samples)) for _ in range(k)]  # shared list objects: each image scored once
    rewards = reward(cands, rows).reshape(len(samples), k)
    greedy_rewards = None
    if greedy is not None:
        greedy_cands = [reward.candidate(vocab.decode(h[0].tokens), h[0].finished) for h in greedy]
        greedy_rewards = torch.from_numpy(reward(greedy_cands, refs))
    adv = advantages(torch.from_numpy(rewards), cfg.scst_baseline, greedy_rewards).reshape(-1).float()

    targets_np, lengths = stack_hypotheses(flat, vocab.pad_id, eos_id=vocab.eos_id)
    targets = torch.from_numpy(targets_np)
    if targets.shape[1] == 0:  # cannot happen with max_len >= 1; keeps the shapes valid regardless
        targets = torch.full((len(flat), 1), vocab.pad_id, dtype=torch.long)
    bos = torch.full((len(flat), 1), vocab.bos_id, dtype=torch.long)
    tf_inputs = torch.cat([bos, targets[:, :-1]], dim=1)
    mask = torch.arange(targets.shape[1])[None, :] < torch.from_numpy(lengths)[:, None]
    captions = [" ".join(vocab.decode(hyps[0].tokens)) for hyps in samples]
    return Rollout(tf_inputs.to(device), targets.to(device), mask.to(device), adv.to(device), rewards, captions)


def scst_objective(
    model: Any, visual: Any, roll: Rollout, samples: int, norm: str, levels: torch.Tensor | None = None
) -> torch.Tensor:
    """The policy-gradient loss of a rollout: one teacher-forced pass with gradient over the sampled sequences."""
    extra = {} if levels is None else {"length_level": levels.to(visual.features.device).repeat_interleave(samples)}
    with _autocast(visual):
        memory = model.encode_memory(visual.features, visual.boxes, visual.mask).repeat_interleave(samples, dim=0)
        mask = visual.mask.repeat_interleave(samples, dim=0)
        logprobs = model.decode_full(memory, mask, roll.inputs, **extra)
    token_lp = logprobs.float().gather(-1, roll.targets.unsqueeze(-1)).squeeze(-1)
    return scst_loss(token_lp, roll.mask, roll.advantage, norm)
