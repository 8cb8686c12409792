"""Fake step models with known log-probabilities, for exact decoding goldens (fairseq ``TestSequenceGenerator`` style).

Token layout of the scripted tests: PAD=0, BOS=1, EOS=2, then word tokens A=3, B=4, C=5, D=6 (V=7).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

PAD, BOS, EOS, A, B, C, D = range(7)
VOCAB = 7

Script = Mapping[tuple[int, ...], Mapping[int, float]]


class ScriptedStepModel:
    """Next-token probabilities looked up by (image, prefix), the prefix excluding BOS.

    ``scripts[i][prefix]`` maps tokens to probabilities (missing tokens get probability 0, i.e. log-prob −inf); a
    prefix absent from the script uses ``default`` (EOS with probability 1 unless given). The state carries the image
    id and the whole prefix, so ``select`` mistakes show up as wrong continuations. Every ``step`` call records its
    batch size in ``calls`` and its input tokens in ``fed``.
    """

    def __init__(
        self, scripts: Sequence[Script], vocab_size: int = VOCAB, default: Mapping[int, float] | None = None
    ) -> None:
        self.scripts = list(scripts)
        self.vocab_size = vocab_size
        self.default = dict(default) if default is not None else {EOS: 1.0}
        self.calls: list[int] = []
        self.fed: list[list[int]] = []

    def inputs(self, images: Sequence[int] | None = None) -> dict[str, Tensor]:
        ids = list(range(len(self.scripts))) if images is None else list(images)
        return {"image": torch.tensor(ids, dtype=torch.long)}

    def encode(self, inputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        image = inputs["image"].long()
        return {"image": image, "prefix": torch.empty(image.shape[0], 0, dtype=torch.long)}

    def distribution(self, image: int, prefix: tuple[int, ...]) -> dict[int, float]:
        return dict(self.scripts[image].get(prefix, self.default))

    def step(self, tokens: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        self.calls.append(int(tokens.shape[0]))
        self.fed.append(tokens.tolist())
        prefix = torch.cat([state["prefix"], tokens[:, None].long()], dim=1)
        rows = []
        for image, seq in zip(state["image"].tolist(), prefix.tolist(), strict=True):
            probs = self.distribution(image, tuple(seq[1:]))
            rows.append([math.log(probs[v]) if probs.get(v, 0.0) > 0 else -math.inf for v in range(self.vocab_size)])
        return torch.tensor(rows, dtype=torch.float32), {"image": state["image"], "prefix": prefix}

    def select(self, state: dict[str, Tensor], index: Tensor) -> dict[str, Tensor]:
        return {name: value.index_select(0, index) for name, value in state.items()}


class RandomStepModel(ScriptedStepModel):
    """Log-probs drawn once per (image, prefix) from a seeded generator: arbitrary but reproducible distributions."""

    def __init__(self, images: int, vocab_size: int, seed: int = 0, sharpness: float = 2.0) -> None:
        super().__init__([{} for _ in range(images)], vocab_size)
        self.seed, self.sharpness = seed, sharpness

    def logprobs(self, image: int, prefix: tuple[int, ...]) -> list[float]:
        key = zlib.crc32(repr((self.seed, image, prefix)).encode())
        gen = torch.Generator().manual_seed(key)
        logits = torch.randn(self.vocab_size, generator=gen, dtype=torch.float64) * self.sharpness
        return torch.log_softmax(logits, dim=0).tolist()

    def distribution(self, image: int, prefix: tuple[int, ...]) -> dict[int, float]:
        return {v: math.exp(lp) for v, lp in enumerate(self.logprobs(image, prefix))}


def sequence_logprob(model: ScriptedStepModel, image: int, tokens: Sequence[int], eos_id: int | None = EOS) -> float:
    """Sum of log-probs of ``tokens`` (+ ``eos_id`` unless None) under ``model``, in float64 (the oracle)."""
    total, prefix = 0.0, ()
    for token in [*tokens, *([eos_id] if eos_id is not None else [])]:
        p = model.distribution(image, prefix).get(token, 0.0)
        total += math.log(p) if p > 0 else -math.inf
        prefix = (*prefix, token)
    return total


# Greedy and beam search disagree here: greedy takes A (0.5) then EOS (0.4) = 0.2, while beam 2 finds B C EOS
# = 0.4 · 0.9 · 0.8 = 0.288 (worked through in tests/decoding/test_beam.py).
GREEDY_VS_BEAM: Script = {
    (): {A: 0.5, B: 0.4, EOS: 0.1},
    (A,): {EOS: 0.4, C: 0.35, D: 0.25},
    (B,): {C: 0.9, EOS: 0.1},
    (A, C): {EOS: 0.6, D: 0.4},
    (A, D): {EOS: 0.7, C: 0.3},
    (B, C): {EOS: 0.8, C: 0.2},
}

# A short caption wins on raw log-prob, a longer one once scores are length-normalised.
SHORT_VS_LONG: Script = {
    (): {A: 0.6, B: 0.4},
    (A,): {EOS: 0.6, C: 0.4},
    (B,): {C: 1.0},
    (B, C): {EOS: 0.85, C: 0.15},
    (A, C): {EOS: 1.0},
}

# EOS is the most likely first token.
EOS_FIRST: Script = {(): {EOS: 0.7, A: 0.3}}
