"""Official-layout state dicts built from the fixtures, and the check that every tensor landed where it should."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

FIXTURES = Path(__file__).parent / "fixtures"


def load_fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def official_pe(length: int, d: int) -> torch.Tensor:
    """The Annotated Transformer's sinusoidal table as the official PositionalEncoding saves it, (1, length, d)."""
    pe = torch.zeros(length, d)
    position = torch.arange(0, length).unsqueeze(1).float()
    div = torch.exp(torch.arange(0, d, 2).float() * -(math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(position * div)
    pe[:, 1::2] = torch.cos(position * div)
    return pe[None]


def official_state(fixture: Mapping[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under the official names; aliases are the very same tensor (as ``state_dict`` gives them)."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, shape in fixture["tensors"].items():
        if name in fixture.get("aliases", {}):
            continue
        if name.endswith(".pe"):
            state[name] = official_pe(shape[1], shape[2])
        else:
            state[name] = torch.randn(*shape, generator=gen) * 0.2
    for name, target in fixture.get("aliases", {}).items():
        state[name] = state[target]
    return state


def sentencepiece_vocab(path: Path, words: Sequence[str]) -> Path:
    """A SentencePiece ``.vocab`` file like ACORT's tokenizer writes (specials 0-3, then ``▁word``)."""
    lines = ["<pad>\t0", "<unk>\t0", "<bos>\t0", "<eos>\t0"]
    lines += [f"\u2581{w}\t{-i - 1}" for i, w in enumerate(words)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def check_destinations(
    fixture: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    model_state: Mapping[str, torch.Tensor],
    vocab_rows: Mapping[int, int] | None = None,
    uncovered: Mapping[str, Sequence[int]] | None = None,
) -> None:
    """Every official tensor with a destination equals that row slice of the edgecap tensor, and the destinations
    cover every row of every edgecap tensor (nothing left at its initial value).

    ``vocab_rows`` (official id -> edgecap id) applies to the vocabulary-indexed tensors; ``uncovered`` names rows
    that no official tensor fills (checked by the caller).
    """
    vocab_keys = {"embed.embed.weight", "output_proj.weight", "output_proj.bias"}
    covered: dict[str, set[int]] = {k: set() for k in model_state}
    for name, dest in fixture["dest"].items():
        if dest is None:
            continue
        key, start, stop = dest
        assert key in model_state, f"{name} -> {key}, which the model does not have"
        official = state[name].reshape(stop - start, *model_state[key].shape[1:])
        if vocab_rows is not None and key in vocab_keys:
            rows = [vocab_rows[r] for r in range(start, stop)]
        else:
            rows = list(range(start, stop))
        got = model_state[key][rows]
        assert torch.equal(got, official), f"{name} did not land in {key}[{start}:{stop}]"
        covered[key].update(rows)
    for key, tensor in model_state.items():
        missing = set(range(tensor.shape[0])) - covered[key] - set((uncovered or {}).get(key, ()))
        assert not missing, f"{key}: rows {sorted(missing)[:5]} were not filled from the checkpoint"
