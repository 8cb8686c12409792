"""ExpansionNet v1 and v2 (Hu et al., "Exploring the sequence length bottleneck in the Transformer for Image
Captioning" and "ExpansionNet v2: Block Static Expansion in fast end to end training for Image Captioning").

Architecture (v2 §3.1 Eq. 1-3; v1 §3.4-3.5 Eq. 10-11):

- visual features (B, N, C) -> ``Linear(C, d)`` -> dropout;
- N_enc pre-LN encoder layers ``x + StaticExp(LN(x))``, ``x + FF(LN(x))`` (Block Static Expansion, v2 §3.2);
- tokens -> ``dropout(Embedding(V, d)) · √d + learned positions`` (:class:`ExpansionEmbedding`, the one token path),
  plus a learned length-level embedding for a length-controllable model (LaBERT §3.1, Eq. 2; ``*-len`` variants);
- N_dec pre-LN decoder layers ``DynamicExp``, cross-attention to the memory, FF (Eq. 3) -> ``Linear(d, V)``.

The expansion layers are in :mod:`edgecap.workshop.models.layers.expansion`. Variants (v2 §4.2; v1 §4.2):
``expansionnet-v2``
(d 512, d_ff 2048, 3+3, G = {32, 64, 128, 256, 512}, N_E = 16, a Swin-L grid in the paper), ``expansionnet-v1``
(ExpansionNet_{64,16}: the same sizes with one static length 64, on 2,048-d regions), the compact edge variants
``expansionnet-v2-small`` / ``-xsmall`` and ``expansionnet-test``, and their length-controllable ``*-len`` forms.

Departures, on purpose (``docs/expansionnet.md``, "Deviations"): any backbone (EfficientNet-Lite0 by default, Swin
from timm by name) instead of Swin-L only; the official code's layer "reduce group" is a cfg switch
(``layer_reduce``, on for v2, off for v1 whose paper has no such step); the cross-attention masks padding with
−1e4 (fp16-safe, as the official export); positions are a fixed learned table of ``max_len``; and decoding is
cached (``step``), which the official code leaves out.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from edgecap.workshop.models._expansionnet_cfg import V2_GROUPS, ExpansionNetCfg
from edgecap.workshop.models._registry import FamilyHooks, register_family, register_model
from edgecap.workshop.models.base import CaptionModel, State
from edgecap.workshop.models.layers.attention import MultiHeadAttention, mask_to_bias
from edgecap.workshop.models.layers.expansion import DynamicExpansion, ExpansionCache, StaticExpansion
from edgecap.workshop.models.layers.transformer import FeedForward

__all__ = ["ExpansionEmbedding", "ExpansionNetCaptioner", "ExpansionNetCfg"]

_CACHE_NAMES = ("exp_c", "exp_k", "exp_v1", "exp_v2", "exp_r1", "exp_r2")


class ExpansionEmbedding(nn.Module):
    """Token path of the decoder: ``dropout(E[tokens]) · √d + P[positions]`` (the v2 code's order).

    Kept as one module so that extra per-token inputs are added in one place: a length-controllable model's level
    embedding ``e_l`` (LaBERT §3.1, Eq. 2) is added to every token here, next to the positions.
    """

    def __init__(self, vocab_size: int, dim: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.positions = nn.Embedding(max_len, dim)
        self.dropout = nn.Dropout(dropout)
        self.scale = math.sqrt(dim)
        self.max_len = max_len

    def forward(self, tokens: torch.Tensor, start: int = 0, extra: torch.Tensor | None = None) -> torch.Tensor:
        """``tokens`` (B, T) at positions ``start..start+T-1`` -> (B, T, d); ``extra`` (B, 1, d) is added to every
        token (the length-level embedding of LaBERT Eq. 2). Like the positions it is not dropped out."""
        length = tokens.shape[1]
        if isinstance(start, int) and isinstance(length, int) and start + length > self.max_len:
            raise ValueError(
                f"decoder position {start + length - 1} is past max_len={self.max_len}; "
                f"create the model with a larger max_len (positions are a fixed table)"
            )
        # A gather at arange(start, start + T), not a slice of the table: the slice's exported length
        # min(max_len, past + T) - past made ONNX Runtime's symbolic shape inference (INT8 calibration) merge the
        # cache length with other dims and plan wrong buffer sizes.
        positions = self.positions(torch.arange(length, device=tokens.device) + start)
        x = self.dropout(self.embed(tokens)) * self.scale + positions
        return x if extra is None else x + extra


class _LayerReduce(nn.Module):
    """The official code's "reduce group": ``LN(x_L + Drop(W [x_1; ...; x_L]))``; a plain final LN when off."""

    def __init__(self, dim: int, layers: int, enabled: bool, dropout: float) -> None:
        super().__init__()
        self.proj = nn.Linear(dim * layers, dim) if enabled else None
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(dim)

    def forward(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        x = outputs[-1]
        if self.proj is not None:
            x = x + self.dropout(self.proj(torch.cat(outputs, dim=-1)))
        return self.norm(x)


class _EncoderLayer(nn.Module):
    """``x + Drop(StaticExp(LN(x)))``, ``x + Drop(FF(LN(x)))`` (v2 Eq. 2)."""

    def __init__(self, cfg: ExpansionNetCfg) -> None:
        super().__init__()
        d = cfg.d_model
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.expansion = StaticExpansion(d, cfg.enc_groups, cfg.dropout, cfg.expansion_eps)
        self.ffn = FeedForward(d, cfg.d_ff, cfg.dropout)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.dropout(self.expansion(self.norm1(x), mask))
        return x + self.dropout(self.ffn(self.norm2(x)))


class _DecoderLayer(nn.Module):
    """``DynamicExp``, cross-attention to the memory, FF; pre-LN (v2 Eq. 3)."""

    def __init__(self, cfg: ExpansionNetCfg) -> None:
        super().__init__()
        d = cfg.d_model
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.expansion = DynamicExpansion(d, cfg.dec_slots, cfg.dropout, cfg.expansion_eps)
        self.cross_attn = MultiHeadAttention(d, cfg.heads, None, cfg.dropout)
        self.ffn = FeedForward(d, cfg.d_ff, cfg.dropout)
        self.dropout = nn.Dropout(cfg.dropout)

    def _cross_and_ffn(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.cross_attn.cross_attend(self.norm2(x), k, v, bias))
        return x + self.dropout(self.ffn(self.norm3(x)))

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.expansion(self.norm1(x)))
        return self._cross_and_ffn(x, k, v, bias)

    def step(
        self, x: torch.Tensor, cache: ExpansionCache, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor
    ) -> tuple[torch.Tensor, ExpansionCache]:
        h, cache = self.expansion.step(self.norm1(x), cache)
        return self._cross_and_ffn(x + self.dropout(h), k, v, bias), cache


class ExpansionNetCaptioner(CaptionModel):
    """ExpansionNet v1/v2 captioner; the variant is entirely in ``cfg`` (:class:`ExpansionNetCfg`).

    State (batch-first; ``L`` decoder layers, ``T`` tokens decoded so far, ``E`` = N_E slots):

    - ``memory_bias`` (B, 1, 1, N): 0 for valid regions, −1e4 for padding;
    - ``cross_k``, ``cross_v`` (B, L, H, N, d_k): cross-attention keys/values, computed once per image; these and
      ``memory_bias`` may also come with one row per image for R = G·k hypotheses (:attr:`image_state_names`);
    - per decoder layer ``i``: ``exp_c_i``, ``exp_k_i``, ``exp_v1_i``, ``exp_v2_i`` (B, T, d): the Dynamic
      Expansion's conditioning, key and two value projections of every past token, and ``exp_r1_i``, ``exp_r2_i``
      (B, T, E, T): the forward coefficients of the past slots of both paths, which never change once written
      (the slots themselves are a linear function of them; :meth:`DynamicExpansion.step`).
      One entry per layer (not one stacked tensor) so that a step appends to each cache once instead of also
      re-stacking every layer's cache;
    - ``level_embed`` (B, 1, d), only for a length-controllable model (``cfg.length_levels``): the level embedding
      ``e_l`` of each caption (LaBERT §3.1, Eq. 2), looked up once by :meth:`start` and added to every token's
      embedding; constant over the caption, so a step reads it and never writes it.
    """

    def __init__(self, cfg: ExpansionNetCfg, vocab_size: int) -> None:
        super().__init__(cfg, vocab_size, cfg.feature_dim)
        d = cfg.d_model
        self.feature_embed = nn.Sequential(nn.Linear(cfg.feature_dim, d), nn.Dropout(cfg.feature_dropout))
        self.encoder = nn.ModuleList(_EncoderLayer(cfg) for _ in range(cfg.enc_layers))
        self.encoder_reduce = _LayerReduce(d, cfg.enc_layers, cfg.layer_reduce, cfg.dropout)
        self.embed = ExpansionEmbedding(vocab_size, d, cfg.max_len, cfg.dropout)
        self.decoder = nn.ModuleList(_DecoderLayer(cfg) for _ in range(cfg.dec_layers))
        self.decoder_reduce = _LayerReduce(d, cfg.dec_layers, cfg.layer_reduce, cfg.dropout)
        self.output_proj = nn.Linear(d, vocab_size)
        self._init_length_control(cfg.length_levels, d)  # LaBERT §3.1, Eq. 2: e_l added to every token embedding
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform on every matrix, embeddings included, as the official code initialises (the expansion
        layers' fused projections block by block, as the separate maps they stand for)."""
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for module in self.modules():
            if isinstance(module, (StaticExpansion, DynamicExpansion)):
                module.reset_parameters()

    @property
    def state_names(self) -> tuple[str, ...]:
        names = ("memory_bias", "cross_k", "cross_v", *self._cache_names)
        return self._with_level_state(names)

    @property
    def image_state_names(self) -> tuple[str, ...]:
        return ("memory_bias", "cross_k", "cross_v")

    @property
    def _cache_names(self) -> tuple[str, ...]:
        return tuple(f"{name}_{i}" for i in range(len(self.decoder)) for name in _CACHE_NAMES)

    def _layer_cache_names(self, layer: int) -> tuple[str, ...]:
        return tuple(f"{name}_{layer}" for name in _CACHE_NAMES)

    def _encode_memory_impl(
        self, features: torch.Tensor, boxes: torch.Tensor, feature_mask: torch.Tensor | None
    ) -> torch.Tensor:
        # Boxes are unused: ExpansionNet has no geometry; grid/region order carries no meaning to the expansion.
        x = self.feature_embed(features)
        outputs = []
        for layer in self.encoder:
            x = layer(x, feature_mask)
            outputs.append(x)
        return self.encoder_reduce(outputs)

    def _project_memory(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ks, vs = zip(*(layer.cross_attn.project_memory(memory) for layer in self.decoder), strict=True)
        return torch.stack(ks, dim=1), torch.stack(vs, dim=1)

    def _start_impl(
        self, memory: torch.Tensor, feature_mask: torch.Tensor | None, length_level: torch.Tensor | None = None
    ) -> State:
        cross_k, cross_v = self._project_memory(memory)
        state = {"memory_bias": mask_to_bias(feature_mask, memory), "cross_k": cross_k, "cross_v": cross_v}
        for i, layer in enumerate(self.decoder):
            empty = layer.expansion.empty_cache(memory)
            state.update(zip(self._layer_cache_names(i), empty, strict=True))
        if length_level is not None:
            state["level_embed"] = self._level(length_level)
        return state

    def _step_impl(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        position = state["exp_k_0"].shape[1]
        x = self.embed(tokens[:, None], start=position, extra=state.get("level_embed"))
        outputs, new_state = [], dict(state)
        for i, layer in enumerate(self.decoder):
            names = self._layer_cache_names(i)
            cache = tuple(state[name] for name in names)
            x, cache = layer.step(x, cache, state["cross_k"][:, i], state["cross_v"][:, i], state["memory_bias"])
            outputs.append(x)
            new_state.update(zip(names, cache, strict=True))
        h = self.decoder_reduce(outputs)
        return torch.log_softmax(self.output_proj(h[:, 0]), dim=-1), new_state

    def _decode_full_impl(
        self,
        memory: torch.Tensor,
        feature_mask: torch.Tensor | None,
        tokens: torch.Tensor,
        length_level: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # No token-padding mask: captions are right-padded and the expansion is causal, so real positions never read
        # pads; this keeps teacher forcing identical to step() (the loss ignores pad positions).
        cross_k, cross_v = self._project_memory(memory)
        bias = mask_to_bias(feature_mask, memory)
        x = self.embed(tokens, extra=self._level(length_level))
        outputs = []
        for i, layer in enumerate(self.decoder):
            x = layer(x, cross_k[:, i], cross_v[:, i], bias)
            outputs.append(x)
        return torch.log_softmax(self.output_proj(self.decoder_reduce(outputs)), dim=-1)


register_family(
    "expansionnet",
    ExpansionNetCfg,
    ExpansionNetCaptioner,
    FamilyHooks(export_spec="edgecap.workshop.export.specs.expansionnet:expansionnet_export_spec"),
)


def _v2(**kw: Any) -> ExpansionNetCfg:
    return ExpansionNetCfg(**{"enc_groups": V2_GROUPS, "dec_slots": 16, "layer_reduce": True, **kw})


@register_model
def expansionnet_v2() -> ExpansionNetCfg:
    """v2 §4.2: d 512, d_ff 2048, 3+3 layers, G = {32, 64, 128, 256, 512}, N_E = 16, 8 heads; max_len 74 as the
    official code (longest COCO caption + 20)."""
    return _v2(d_model=512, d_ff=2048, heads=8, enc_layers=3, dec_layers=3, max_len=74)


@register_model
def expansionnet_v2_small() -> ExpansionNetCfg:
    """Edge variant: v2's layout and expansion lengths at d 256, d_ff 1024 (Jetson Nano/Orin-class boards)."""
    return _v2(d_model=256, d_ff=1024, heads=8, enc_layers=3, dec_layers=3)


@register_model
def expansionnet_v2_xsmall() -> ExpansionNetCfg:
    """Edge variant: d 192, d_ff 768, 2+2 layers, G = {16, 32, 64, 128}, N_E = 8 (about acort-xsmall's budget)."""
    return _v2(d_model=192, d_ff=768, heads=8, enc_layers=2, dec_layers=2, enc_groups=(16, 32, 64, 128), dec_slots=8)


@register_model
def expansionnet_v1() -> ExpansionNetCfg:
    """ExpansionNet_{64,16} (v1 §4.2): d 512, d_ff 2048, 3+3, static 64 / dynamic 16, on 2,048-d region features;
    no layer reduce (v1 Eq. 10-11)."""
    return ExpansionNetCfg(
        d_model=512,
        d_ff=2048,
        heads=8,
        enc_layers=3,
        dec_layers=3,
        enc_groups=(64,),
        dec_slots=16,
        layer_reduce=False,
        paper_feature_dim=2048,
    )


@register_model
def expansionnet_test() -> ExpansionNetCfg:
    """d 32, 2 heads, 2+2 layers, G = {3, 5}, N_E = 2: every v2 mechanism (block groups, reduce) at toy size."""
    return _v2(d_model=32, d_ff=64, heads=2, enc_layers=2, dec_layers=2, enc_groups=(3, 5), dec_slots=2)


# -- length-controllable variants (LaBERT §3.1 / Table 1: a length-level embedding added to the token embeddings) ---
# Any ExpansionNet model becomes one with ``--set length_levels=4level`` (or ``5level``); these are the named ones.
@register_model
def expansionnet_v2_len() -> ExpansionNetCfg:
    """ExpansionNet v2 with the 4-level length embedding (2,560 extra parameters at d=512); decoding takes
    ``length_level``."""
    return expansionnet_v2().replace(length_levels="4level")


@register_model
def expansionnet_v2_small_len() -> ExpansionNetCfg:
    """expansionnet-v2-small with the 4-level length embedding (1,280 extra parameters at d=256)."""
    return expansionnet_v2_small().replace(length_levels="4level")


@register_model
def expansionnet_v2_xsmall_len() -> ExpansionNetCfg:
    """expansionnet-v2-xsmall with the 4-level length embedding (960 extra parameters at d=192)."""
    return expansionnet_v2_xsmall().replace(length_levels="4level")


@register_model
def expansionnet_test_len() -> ExpansionNetCfg:
    """expansionnet-test with the 4-level length embedding (length control at toy size)."""
    return expansionnet_test().replace(length_levels="4level")
