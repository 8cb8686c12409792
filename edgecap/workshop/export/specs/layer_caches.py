"""The ORT/ACORT model seen by the export with one self-attention cache per decoder position.

``ORTCaptioner`` keeps its cache as one (B, L, H, T, d_k) tensor (``self_k``, and ``self_v`` unless Share-KV), which
torch steps cheaply. Exported as is, the step graph copies that cache three times per step on ONNX Runtime's CPU
provider: a Split into the L positions (every slice of a graph input is a copy there), a Concat per position, and the
Concat that stacks the positions for the output. :class:`PerLayerCaches` presents the same weights and the same
arithmetic with the states ``self_k0``, ``self_k1`` … (B, H, T, d_k), so the graph's only cache copy is each
position's Concat. ``docs/decoding.md`` has the measurements (≈ 5 % per decode at batch 16 × beam 3 on CPU).

Runtimes need nothing new: they read the state names from the step graph's metadata (or the bundle), so bundles of
either layout decode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from edgecap.workshop.models.layers.transformer import _unique_entry

__all__ = ["CACHE_LAYOUTS", "PerLayerCaches"]

#: Cache layouts of the ORT/ACORT step graph: the model's own stacked cache, or one cache per decoder position.
CACHE_LAYOUTS = ("stacked", "per-layer")
_STACKED = ("self_k", "self_v")


class PerLayerCaches(nn.Module):
    """``model`` (an ``ORTCaptioner``) with its self-attention caches split per decoder position, for export.

    Exposes what :func:`~edgecap.workshop.export.specs.captioning.captioning_spec` reads (``encode_memory``, ``start``,
    ``step``, ``state_names``, ``max_len``, ``vocab_size``, ``feature_dim``, ``length_levels``, ``cfg``); the
    weights are the model's own.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not self.applies_to(model):
            raise ValueError(f"per-layer caches are written for the ORT/ACORT decoder, not {type(model).__name__}")
        self.model = model
        self.positions = len(model.decoder.layers)

    @staticmethod
    def applies_to(model: nn.Module) -> bool:
        """Whether ``model`` has the ORT/ACORT decoder with its stacked ``self_k`` cache (what this layout splits)."""
        return hasattr(getattr(model, "decoder", None), "layers") and "self_k" in getattr(model, "state_names", ())

    # -- the contract captioning_spec reads ----------------------------------------------------------------------------
    @property
    def cfg(self) -> Any:
        return self.model.cfg

    @property
    def max_len(self) -> int:
        return int(self.model.max_len)

    @property
    def vocab_size(self) -> int:
        return int(self.model.vocab_size)

    @property
    def feature_dim(self) -> int:
        return int(self.model.feature_dim)

    @property
    def length_levels(self) -> Any:
        return getattr(self.model, "length_levels", None)

    @property
    def state_names(self) -> tuple[str, ...]:
        """The model's state names with ``self_k``/``self_v`` replaced by ``self_k{i}``/``self_v{i}`` per position."""
        names = [n for n in self.model.state_names if n not in _STACKED]
        for name in _STACKED:
            if name in self.model.state_names:
                names.extend(f"{name}{i}" for i in range(self.positions))
        return tuple(names)

    @property
    def image_state_names(self) -> tuple[str, ...]:
        return tuple(self.model.image_state_names)

    def encode_memory(self, *inputs: torch.Tensor | None) -> torch.Tensor:
        return self.model.encode_memory(*inputs)

    def start(
        self, memory: torch.Tensor, feature_mask: torch.Tensor | None = None, length_level: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """The model's initial state with each empty stacked cache split into its positions."""
        state = dict(self.model.start(memory, feature_mask, length_level))
        for name in _STACKED:
            stacked = state.pop(name, None)
            if stacked is not None:
                state.update((f"{name}{i}", stacked[:, i]) for i in range(self.positions))
        return state

    def step(self, tokens: torch.Tensor, state: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        """``ORTCaptioner.step`` on per-position caches: the same layers in the same order, each position's cache
        grown by its own Concat. States a step does not change are returned as the very tensors given."""
        missing = [n for n in self.state_names if n not in state]
        if missing:
            raise ValueError(f"the state lacks {missing} (per-layer caches take {list(self.state_names)})")
        model, decoder = self.model, self.model.decoder
        x = model.embed(tokens[:, None], start=state["self_k0"].shape[2], extra=state.get("level_embed"))
        cross_k, cross_v = state["cross_k"], state.get("cross_v")
        new_state = dict(state)
        for pos, layer in enumerate(decoder.layers):
            unique = decoder.layers.layer_map[pos]
            ck = _unique_entry(cross_k, unique)
            cv = ck if cross_v is None else _unique_entry(cross_v, unique)
            past_v = state.get(f"self_v{pos}")
            x, k, v = layer.step(x, state[f"self_k{pos}"], past_v, ck, cv, state["memory_bias"])
            new_state[f"self_k{pos}"] = k
            if v is not None:
                new_state[f"self_v{pos}"] = v
        return torch.log_softmax(model.output_proj(decoder.norm(x)[:, 0]), dim=-1), new_state
