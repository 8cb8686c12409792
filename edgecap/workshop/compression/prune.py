"""Structured pruning of attention heads and FFN channels (ORT / ACORT) into a smaller dense config.

Importance is first-order Taylor (Molchanov et al. 2019, "Importance Estimation for Neural Network Pruning", §3):
the loss change when a unit's gate ξ goes from 1 to 0 is about ``|∂L/∂ξ|``. For a head ``h`` whose output enters
``out_proj`` through columns ``C_h``, ``∂L/∂ξ_h = Σ_{i, c ∈ C_h} (∂L/∂W_O)[i, c] · W_O[i, c]``, which is Michel et
al. 2019 ("Are Sixteen Heads Really Better than One?", §4.1) head importance; an FFN channel's gate is the same sum
over its ``fc2`` column. So the scores come from weight gradients of a few training batches, no hooks, and a layer
shared across positions (ACORT §4.2) gets the sum over every position it runs at: a shared layer is scored, and
pruned, once for everywhere it is used.

Units are removed greedily, cheapest loss per parameter first, until the count is at or below the target. Heads go
in rounds of one head from every attention: the decoder's caches stack every layer's keys into one
``(B, L, H, T, d_k)`` tensor (and cross-attention keys ``(B, U, H, N, d_k)``), so every attention keeps the same
number of heads, each its own most important ones; FFN widths differ per unique layer
(``ObjectRelationCfg.enc_d_ff``/``dec_d_ff``). Heads keep their ``d_k`` (``d_head``). The pruned model is a plain
dense config that every runtime runs as it runs any other.

torch.nn.utils.prune is not used here: it masks weights (same shapes, same speed) instead of removing them, and
torch-pruning style dependency graphs do not know ACORT's shared layers and Share-KV projections; the slicing below
is the few lines that remove exactly what the masks would zero.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from edgecap.workshop.models.layers.attention import MultiHeadAttention
from edgecap.workshop.models.layers.transformer import EncoderLayer, FeedForward

__all__ = [
    "PRUNABLE_FAMILIES",
    "PruneError",
    "PrunePlan",
    "apply_plan",
    "min_params",
    "plan_pruning",
    "taylor_importance",
]

PRUNABLE_FAMILIES = ("ort",)


class PruneError(ValueError):
    """A model that cannot be pruned (its family) or a target it cannot reach."""


@dataclass(frozen=True)
class PrunePlan:
    """Which heads (per attention module) and FFN channels (per FFN module) stay; indices ascending."""

    heads: dict[str, list[int]]
    ffn: dict[str, list[int]]
    params: int


def check_prunable(model: nn.Module) -> None:
    family = getattr(getattr(model, "cfg", None), "family", None)
    if family not in PRUNABLE_FAMILIES:
        raise PruneError(
            f"structured pruning supports the {', '.join(PRUNABLE_FAMILIES)} family (ORT/ACORT) only; this model's "
            f"family is {family!r} (2:4 sparsity, `edgecap prune --sparsity 2:4`, works for every family)"
        )


def _attentions(model: nn.Module) -> dict[str, MultiHeadAttention]:
    return {n: m for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)}


def _ffns(model: nn.Module) -> dict[str, FeedForward]:
    return {n: m for n, m in model.named_modules() if isinstance(m, FeedForward)}


def _geometric(model: nn.Module) -> dict[str, nn.Linear]:
    """Attention module name -> its layer's box-relational ``W_G`` (one output per head)."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, EncoderLayer) and mod.geometric_bias is not None:
            out[f"{name}.attn"] = mod.geometric_bias.proj
    return out


def _head_cost(model: nn.Module, name: str, attn: MultiHeadAttention) -> int:
    """Parameters one head of ``attn`` holds: its rows of each input projection, its ``out_proj`` columns and its
    ``W_G`` row."""
    projections = sum(p is not None for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    cost = projections * attn.head_dim * (attn.dim + 1) + attn.head_dim * attn.dim
    geo = _geometric(model).get(name)
    return cost + (geo.in_features + 1 if geo is not None else 0)


def _channel_cost(ffn: FeedForward) -> int:
    return 2 * ffn.fc1.in_features + 1


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def min_params(model: nn.Module) -> int:
    """The smallest count pruning can reach: one head in every attention, one channel in every FFN."""
    check_prunable(model)
    attns = _attentions(model)
    heads = next(iter(attns.values())).heads
    head_round = sum(_head_cost(model, n, a) for n, a in attns.items())
    channels = sum((f.fc1.out_features - 1) * _channel_cost(f) for f in _ffns(model).values())
    return count_params(model) - (heads - 1) * head_round - channels


@dataclass(frozen=True)
class Importance:
    """First-order Taylor scores: per attention module (H,), per FFN module (d_ff,)."""

    heads: dict[str, torch.Tensor]
    ffn: dict[str, torch.Tensor]


def taylor_importance(model: nn.Module, losses: Iterable[torch.Tensor]) -> Importance:
    """Accumulate ``|∂L/∂ξ|`` per head and FFN channel over the batches whose losses ``losses`` yields (each loss is
    computed by the caller on ``model``; this function runs the backward passes). The model's gradients are left
    cleared."""
    check_prunable(model)
    attns, ffns = _attentions(model), _ffns(model)
    heads = {n: torch.zeros(a.heads) for n, a in attns.items()}
    channels = {n: torch.zeros(f.fc1.out_features) for n, f in ffns.items()}
    for loss in losses:
        model.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for n, a in attns.items():
                w = a.out_proj.weight
                gate = (w.grad * w).sum(0) if w.grad is not None else torch.zeros_like(w[0])
                heads[n] += gate.view(a.heads, a.head_dim).sum(1).abs().cpu()
            for n, f in ffns.items():
                w = f.fc2.weight
                gate = (w.grad * w).sum(0) if w.grad is not None else torch.zeros_like(w[0])
                channels[n] += gate.abs().cpu()
    model.zero_grad(set_to_none=True)
    return Importance(heads, channels)


def plan_pruning(model: nn.Module, importance: Importance, target_params: int) -> PrunePlan:
    """Remove the unit with the least importance per parameter until the model has at most ``target_params``.

    A head "unit" is one round (the least important remaining head of every attention, see the module docstring);
    an FFN unit is one channel of one FFN. ``target_params >= current`` keeps everything.

    Raises:
        PruneError: the target is below :func:`min_params`.
    """
    floor = min_params(model)
    if target_params < floor:
        raise PruneError(
            f"cannot prune to {target_params:,} parameters: one head per attention and one FFN channel per layer "
            f"leave {floor:,}"
        )
    attns, ffns = _attentions(model), _ffns(model)
    head_order = {n: torch.argsort(s, stable=True).tolist() for n, s in importance.heads.items()}
    chan_order = {n: torch.argsort(s, stable=True).tolist() for n, s in importance.ffn.items()}
    n_heads = next(iter(attns.values())).heads
    head_round = sum(_head_cost(model, n, a) for n, a in attns.items())
    removed_heads = 0
    removed_chans = dict.fromkeys(ffns, 0)
    params = count_params(model)
    while params > target_params:
        best: tuple[float, str | None] = (float("inf"), None)
        if n_heads - removed_heads > 1:
            score = sum(float(importance.heads[n][head_order[n][removed_heads]]) for n in attns)
            best = (score / head_round, None)
        for n, f in ffns.items():
            if f.fc1.out_features - removed_chans[n] > 1:
                score = float(importance.ffn[n][chan_order[n][removed_chans[n]]]) / _channel_cost(f)
                if score < best[0]:
                    best = (score, n)
        if best[1] is None:
            removed_heads += 1
            params -= head_round
        else:
            removed_chans[best[1]] += 1
            params -= _channel_cost(ffns[best[1]])
    return PrunePlan(
        heads={n: sorted(head_order[n][removed_heads:]) for n in attns},
        ffn={n: sorted(chan_order[n][removed_chans[n] :]) for n in ffns},
        params=params,
    )


def pruned_cfg(model: nn.Module, plan: PrunePlan) -> Any:
    """The dense config of the pruned model (``heads``, ``d_head``, ``enc_d_ff``/``dec_d_ff``); fields stay at their
    defaults where nothing was removed, so an unpruned plan gives the same config."""
    cfg: Any = model.cfg
    heads = len(next(iter(plan.heads.values())))
    changes: dict[str, Any] = {}
    if heads != cfg.heads:
        changes.update(heads=heads, d_head=cfg.head_dim)
    for side, map_field in (("enc", "enc_layer_map"), ("dec", "dec_layer_map")):
        unique = max(getattr(cfg, map_field)) + 1
        widths = tuple(len(plan.ffn[f"{side}oder.layers.unique.{i}.ffn"]) for i in range(unique))
        if widths != getattr(cfg, f"{side}_widths"):
            changes[f"{side}_d_ff"] = widths
    return cfg.replace(**changes) if changes else cfg


def _slices(model: nn.Module, plan: PrunePlan) -> dict[str, tuple[int, torch.Tensor]]:
    """State-dict key -> (dimension, kept indices) for every tensor pruning shrinks."""
    out: dict[str, tuple[int, torch.Tensor]] = {}
    attns = _attentions(model)
    geo = _geometric(model)
    for n, kept in plan.heads.items():
        a = attns[n]
        rows = torch.tensor([h * a.head_dim + j for h in kept for j in range(a.head_dim)], dtype=torch.long)
        for proj in ("q_proj", "k_proj", "v_proj"):
            if getattr(a, proj) is not None:
                out[f"{n}.{proj}.weight"] = (0, rows)
                out[f"{n}.{proj}.bias"] = (0, rows)
        out[f"{n}.out_proj.weight"] = (1, rows)
        if n in geo:
            layer = n.rsplit(".", 1)[0]
            out[f"{layer}.geometric_bias.proj.weight"] = (0, torch.tensor(kept, dtype=torch.long))
            out[f"{layer}.geometric_bias.proj.bias"] = (0, torch.tensor(kept, dtype=torch.long))
    for n, kept in plan.ffn.items():
        idx = torch.tensor(kept, dtype=torch.long)
        out[f"{n}.fc1.weight"] = (0, idx)
        out[f"{n}.fc1.bias"] = (0, idx)
        out[f"{n}.fc2.weight"] = (1, idx)
    return out


def apply_plan(model: nn.Module, plan: PrunePlan) -> nn.Module:
    """A new model of :func:`pruned_cfg` holding ``model``'s kept weights (same dtype and device, eval mode)."""
    from edgecap.workshop.models import create_model_from_cfg

    check_prunable(model)
    cfg = pruned_cfg(model, plan)
    pruned = create_model_from_cfg(cfg, vocab_size=model.vocab_size)  # type: ignore[arg-type]
    slices = _slices(model, plan)
    state = {}
    for key, tensor in model.state_dict().items():
        if key in slices:
            dim, idx = slices[key]
            tensor = tensor.index_select(dim, idx.to(tensor.device))
        state[key] = tensor
    pruned.load_state_dict(state, strict=True)
    first = next(model.parameters())
    return pruned.to(device=first.device, dtype=first.dtype).eval()
