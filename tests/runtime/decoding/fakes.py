"""Fake step models with known log-probabilities, for exact decoding goldens (fairseq ``TestSequenceGenerator`` style).

Token layout of the scripted tests: PAD=0, BOS=1, EOS=2, then word tokens A=3, B=4, C=5, D=6 (V=7).

The fakes hold their state and return their log-probs in the array type of :data:`BACKEND` — ``"numpy"`` (what
ONNX Runtime adapters return) or ``"torch"`` (the torch adapters) — which ``tests/runtime/decoding/conftest.py`` sets
per test,
so every search test runs against every array type the search accepts. Whatever the backend, they check the search's
side of the contract: tokens and row indices arrive as int64 numpy arrays.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgecap.runtime.decoding.arrays import to_numpy

PAD, BOS, EOS, A, B, C, D = range(7)
VOCAB = 7
#: The array type the fakes return: "numpy" or "torch" (set by the ``array_backend`` fixture).
BACKEND = "numpy"


def as_backend(array: np.ndarray, backend: str | None = None) -> Any:
    """``array`` in the current backend's array type (a torch tensor shares the numpy memory)."""
    if (backend or BACKEND) == "torch":
        import torch

        return torch.from_numpy(np.require(array, requirements=["C", "W"]))
    return array


def check_index(index: Any, what: str) -> np.ndarray:
    """The search's side of the contract: ``step`` tokens and ``select`` indices are (N,) int64 numpy arrays."""
    assert type(index) is np.ndarray and index.dtype == np.int64 and index.ndim == 1, (what, type(index), index)
    return index


Script = Mapping[tuple[int, ...], Mapping[int, float]]


class ScriptedStepModel:
    """Next-token probabilities looked up by (image, prefix), the prefix excluding BOS.

    ``scripts[i][prefix]`` maps tokens to probabilities (missing tokens get probability 0, i.e. log-prob −inf); a
    prefix absent from the script uses ``default`` (EOS with probability 1 unless given). The state carries the image
    id and the whole prefix, so ``select`` mistakes show up as wrong continuations. Every ``step`` call records its
    batch size in ``calls`` and its input tokens in ``fed``. State and log-probs are :data:`BACKEND` arrays.
    """

    def __init__(
        self, scripts: Sequence[Script], vocab_size: int = VOCAB, default: Mapping[int, float] | None = None
    ) -> None:
        self.scripts = list(scripts)
        self.vocab_size = vocab_size
        self.default = dict(default) if default is not None else {EOS: 1.0}
        self.calls: list[int] = []
        self.fed: list[list[int]] = []

    def inputs(self, images: Sequence[int] | None = None) -> dict[str, Any]:
        ids = list(range(len(self.scripts))) if images is None else list(images)
        return {"image": as_backend(np.asarray(ids, dtype=np.int64))}

    def encode(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        image = to_numpy(inputs["image"], np.int64)
        return {"image": as_backend(image), "prefix": as_backend(np.empty((image.shape[0], 0), dtype=np.int64))}

    def distribution(self, image: int, prefix: tuple[int, ...]) -> dict[int, float]:
        return dict(self.scripts[image].get(prefix, self.default))

    def step(self, tokens: np.ndarray, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        check_index(tokens, "step tokens")
        self.calls.append(int(tokens.shape[0]))
        self.fed.append(tokens.tolist())
        prefix = np.concatenate([to_numpy(state["prefix"]), tokens[:, None]], axis=1)
        rows = []
        for image, seq in zip(to_numpy(state["image"]).tolist(), prefix.tolist(), strict=True):
            probs = self.distribution(image, tuple(seq[1:]))
            rows.append([math.log(probs[v]) if probs.get(v, 0.0) > 0 else -math.inf for v in range(self.vocab_size)])
        logprobs = as_backend(np.asarray(rows, dtype=np.float32).reshape(len(rows), self.vocab_size))
        return logprobs, {"image": state["image"], "prefix": as_backend(prefix)}

    def select(self, state: dict[str, Any], index: np.ndarray) -> dict[str, Any]:
        check_index(index, "select index")
        return {name: as_backend(to_numpy(value)[index]) for name, value in state.items()}


class RandomStepModel(ScriptedStepModel):
    """Log-probs drawn once per (image, prefix) from a seeded generator: arbitrary but reproducible distributions."""

    def __init__(self, images: int, vocab_size: int, seed: int = 0, sharpness: float = 2.0) -> None:
        super().__init__([{} for _ in range(images)], vocab_size)
        self.seed, self.sharpness = seed, sharpness

    def logprobs(self, image: int, prefix: tuple[int, ...]) -> list[float]:
        rng = np.random.default_rng(zlib.crc32(repr((self.seed, image, prefix)).encode()))
        logits = rng.standard_normal(self.vocab_size) * self.sharpness
        shifted = logits - logits.max()
        return (shifted - np.log(np.exp(shifted).sum())).tolist()

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
# = 0.4 · 0.9 · 0.8 = 0.288 (worked through in tests/runtime/decoding/test_beam.py).
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
