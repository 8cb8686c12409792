"""The official ORT / ACORT state-dict layout (Annotated-Transformer naming) mapped onto ``ORTCaptioner``.

Official names (``model`` = the encoder-decoder, ``att_embed`` = the region embedding beside it; ``{i}`` a layer
position, ``{j}`` a projection, ``{h}`` a head):

==============================================================  ===================================================
official                                                        edgecap
==============================================================  ===================================================
``att_embed.0.{weight,bias}``                                   ``feature_embed.0.*``
``model.encoder.layers.{i}.self_attn.linears.{j}.*``            ``encoder.layers.unique.{u}.attn.{q,k,v,out}_proj``
``model.encoder.layers.{i}.self_attn.WGs.{h}.weight`` (1, 64)   rows of ``…geometric_bias.proj.weight`` (H, 64)
``model.encoder.layers.{i}.feed_forward.w_{1,2}.*``             ``…ffn.fc{1,2}.*``
``model.encoder.layers.{i}.sublayer.{s}.norm.{a_2,b_2}``        ``…norm{s+1}.{weight,bias}``
``model.decoder.layers.{i}.{self_attn,src_attn}.linears.{j}``   ``decoder.layers.unique.{u}.{self,cross}_attn.*``
``model.{encoder,decoder}.norm.{a_2,b_2}``                      ``{encoder,decoder}.norm.*``
``model.tgt_embed.0.lut.weight``                                ``embed.embed.weight``
``model.tgt_embed.1.pe`` (1, 5000, d)                           checked against our sinusoid table, not stored
``model.generator.proj.*``                                      ``output_proj.*``
==============================================================  ===================================================

Projection order of ``linears``: ``[Q, K, V, out]`` without sharing, ``[Q, K(=V), out]`` under Share-KV and
``[Q(=K), V, out]`` under Share-QK (ACORT §4.3). Layer sharing repeats one module at several positions, so its
tensors appear once per position; they collapse onto one unique layer (:func:`shared_layer_map`).
"""

from __future__ import annotations

from typing import Any

import torch

from edgecap.workshop.interop._mapping import OfficialState, layer_positions, shared_layer_map
from edgecap.workshop.interop._reading import CheckpointError
from edgecap.workshop.models.layers.position import sinusoid_table

__all__ = ["PROJECTIONS", "convert_relation_transformer", "infer_relation_transformer"]

#: ``linears.{j}`` -> edgecap projection, per attention sharing (ACORT §4.3).
PROJECTIONS: dict[str | None, tuple[str, ...]] = {
    None: ("q_proj", "k_proj", "v_proj", "out_proj"),
    "kv": ("q_proj", "k_proj", "out_proj"),
    "qk": ("q_proj", "v_proj", "out_proj"),
}
_ENC, _DEC = "model.encoder.layers.", "model.decoder.layers."
#: The official positional table holds 5,000 rows computed in float32; ours is float64 rounded once.
_PE_TOLERANCE = 1e-4


def _linear_count(state: OfficialState, prefix: str) -> int:
    return layer_positions(state, prefix)


def infer_relation_transformer(state: OfficialState, share_att: str) -> dict[str, Any]:
    """The architecture fields an official ORT/ACORT state dict implies.

    ``share_att`` resolves what shapes cannot tell apart: 3 projections per attention are Share-KV or Share-QK.
    """
    weight = state.peek("att_embed.0.weight", ndim=2)
    d_model, feature_dim = int(weight.shape[0]), int(weight.shape[1])
    counts = {
        "encoder": _linear_count(state, f"{_ENC}0.self_attn.linears."),
        "decoder self-attention": _linear_count(state, f"{_DEC}0.self_attn.linears."),
        "decoder cross-attention": _linear_count(state, f"{_DEC}0.src_attn.linears."),
    }
    if len(set(counts.values())) != 1:
        raise CheckpointError(
            f"{state.source}: attention sharing differs between encoder and decoder ({counts} projections); edgecap "
            "uses one share_att for every attention"
        )
    count = next(iter(counts.values()))
    if count == 4:
        sharing = None
    elif count == 3:
        if share_att not in ("kv", "qk"):
            raise CheckpointError(f"{state.source}: 3 projections per attention need share_att 'kv' or 'qk'")
        sharing = share_att
    else:
        raise CheckpointError(f"{state.source}: {count} projections per attention; expected 3 or 4")
    heads = layer_positions(state, f"{_ENC}0.self_attn.WGs.")
    geometry_dim = int(state.peek(f"{_ENC}0.self_attn.WGs.0.weight", ndim=2).shape[1])
    return {
        "d_model": d_model,
        "feature_dim": feature_dim,
        "d_ff": int(state.peek(f"{_ENC}0.feed_forward.w_1.weight", ndim=2).shape[0]),
        "heads": heads,
        "geometry_dim": geometry_dim,
        "share_att": sharing,
        "enc_layer_map": shared_layer_map(state, _ENC),
        "dec_layer_map": shared_layer_map(state, _DEC),
        "vocab_size": int(state.peek("model.generator.proj.weight", ndim=2).shape[0]),
    }


def _norm(state: OfficialState, official: str, ours: str, d: int) -> dict[str, torch.Tensor]:
    return {f"{ours}.weight": state.take(f"{official}.a_2", (d,)), f"{ours}.bias": state.take(f"{official}.b_2", (d,))}


def _linear(state: OfficialState, official: str, ours: str, out_f: int, in_f: int) -> dict[str, torch.Tensor]:
    return {
        f"{ours}.weight": state.take(f"{official}.weight", (out_f, in_f)),
        f"{ours}.bias": state.take(f"{official}.bias", (out_f,)),
    }


def _attention(state: OfficialState, official: str, ours: str, d: int, share: str | None) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for j, name in enumerate(PROJECTIONS[share]):
        out.update(_linear(state, f"{official}.linears.{j}", f"{ours}.{name}", d, d))
    return out


def _representatives(layer_map: tuple[int, ...]) -> list[int]:
    """Position of the first occurrence of each unique layer."""
    return [layer_map.index(u) for u in range(max(layer_map) + 1)]


def _discard_aliases(state: OfficialState, prefix: str, layer_map: tuple[int, ...]) -> None:
    """Positions that repeat a unique layer hold the same tensors (checked by :func:`shared_layer_map`)."""
    reps = set(_representatives(layer_map))
    for i in range(len(layer_map)):
        if i not in reps:
            state.discard([k for k in state.names() if k.startswith(f"{prefix}{i}.")])


def convert_relation_transformer(state: OfficialState, arch: dict[str, Any], max_len: int) -> dict[str, torch.Tensor]:
    """Official tensors -> ``ORTCaptioner`` state dict (same vocabulary rows; importers permute them afterwards)."""
    d, d_ff, heads, g = arch["d_model"], arch["d_ff"], arch["heads"], arch["geometry_dim"]
    share, vocab = arch["share_att"], arch["vocab_size"]
    out = _linear(state, "att_embed.0", "feature_embed.0", d, arch["feature_dim"])
    for u, i in enumerate(_representatives(arch["enc_layer_map"])):
        src, dst = f"{_ENC}{i}", f"encoder.layers.unique.{u}"
        out.update(_attention(state, f"{src}.self_attn", f"{dst}.attn", d, share))
        wg = [state.take(f"{src}.self_attn.WGs.{h}.weight", (1, g)) for h in range(heads)]
        wb = [state.take(f"{src}.self_attn.WGs.{h}.bias", (1,)) for h in range(heads)]
        out[f"{dst}.geometric_bias.proj.weight"] = torch.cat(wg, dim=0)
        out[f"{dst}.geometric_bias.proj.bias"] = torch.cat(wb, dim=0)
        out.update(_linear(state, f"{src}.feed_forward.w_1", f"{dst}.ffn.fc1", d_ff, d))
        out.update(_linear(state, f"{src}.feed_forward.w_2", f"{dst}.ffn.fc2", d, d_ff))
        for s in range(2):
            out.update(_norm(state, f"{src}.sublayer.{s}.norm", f"{dst}.norm{s + 1}", d))
    for u, i in enumerate(_representatives(arch["dec_layer_map"])):
        src, dst = f"{_DEC}{i}", f"decoder.layers.unique.{u}"
        out.update(_attention(state, f"{src}.self_attn", f"{dst}.self_attn", d, share))
        out.update(_attention(state, f"{src}.src_attn", f"{dst}.cross_attn", d, share))
        out.update(_linear(state, f"{src}.feed_forward.w_1", f"{dst}.ffn.fc1", d_ff, d))
        out.update(_linear(state, f"{src}.feed_forward.w_2", f"{dst}.ffn.fc2", d, d_ff))
        for s in range(3):
            out.update(_norm(state, f"{src}.sublayer.{s}.norm", f"{dst}.norm{s + 1}", d))
    _discard_aliases(state, _ENC, arch["enc_layer_map"])
    _discard_aliases(state, _DEC, arch["dec_layer_map"])
    out.update(_norm(state, "model.encoder.norm", "encoder.norm", d))
    out.update(_norm(state, "model.decoder.norm", "decoder.norm", d))
    out["embed.embed.weight"] = state.take("model.tgt_embed.0.lut.weight", (vocab, d))
    out.update(_linear(state, "model.generator.proj", "output_proj", vocab, d))
    if "model.tgt_embed.1.pe" in state:
        _check_positions(state, state.take("model.tgt_embed.1.pe"), d, max_len)
    return out


def _check_positions(state: OfficialState, pe: torch.Tensor, d: int, max_len: int) -> None:
    """The official sinusoidal table is a saved buffer; ours is computed. They must agree on the rows we use."""
    if pe.dim() != 3 or pe.shape[0] != 1 or pe.shape[2] != d or pe.shape[1] < max_len:
        raise CheckpointError(
            f"{state.source}: tensor 'model.tgt_embed.1.pe' (the positional table) has shape {tuple(pe.shape)}, "
            f"expected (1, ≥{max_len}, {d})"
        )
    gap = float((pe[0, :max_len].float() - sinusoid_table(max_len, d)).abs().max())
    if gap > _PE_TOLERANCE:
        raise CheckpointError(
            f"{state.source}: the checkpoint's positional table differs from the sinusoidal one by {gap:.2e}; "
            "edgecap computes positions and cannot reproduce a modified table"
        )
