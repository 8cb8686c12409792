"""Object Relation Transformer (ORT; Herdade et al. 2019) and ACORT (Tan et al., "ACORT: A Compact Object Relation
Transformer for Parameter Efficient Image Captioning").

Naming: this module, the family ``"ort"`` and the ``ort-*``/``acort-*`` model names are the paper's. ONNX Runtime is
never called "ort" in edgecap's names: its runtime is ``"onnxruntime"``
(``edgecap.runtime.backends.onnxruntime.session``).

ORT (ACORT §3): visual features -> ``Linear(C, d) + ReLU + Dropout`` -> pre-LN Transformer encoder whose
self-attention is box-relational -> Transformer decoder (masked self-attention, cross-attention, FFN) over
``Embedding · √d + sinusoidal positions`` -> untied ``Linear(d, V)`` -> log-softmax.

ACORT (§4) is the same network with (§4.1) radix-encoded tokens (``V = v + 3``), (§4.2) cross-layer parameter
sharing through layer maps and (§4.3) attention parameter sharing (Share-KV in every attention). Configurations and
parameter counts follow Table 1: at the paper's setting (2,048-d regions, 10,001-id word vocabulary or 771 radix
classes) they equal the reference's totals exactly and Table 1 to its rounding
(``tests/workshop/models/test_registry.py``).

Departures from the released ORT code, on purpose: standard LayerNorm (``layer_norm="annotated"`` reproduces theirs),
no ``+1`` on box sizes (``box_wh_offset=1.0`` reproduces it), the box embedding computed once per forward, finite
``-1e4`` masking (fp16-safe), and a decoder cache indexed by layer position, not by (shared) module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from edgecap.workshop.models._ort_cfg import ObjectRelationCfg
from edgecap.workshop.models._registry import FamilyHooks, register_family, register_model
from edgecap.workshop.models.base import CaptionModel, State
from edgecap.workshop.models.layers.attention import mask_to_bias
from edgecap.workshop.models.layers.geometry import box_relational_angles
from edgecap.workshop.models.layers.position import TokenEmbedding
from edgecap.workshop.models.layers.transformer import TransformerDecoder, TransformerEncoder

__all__ = ["ORTCaptioner"]


class ORTCaptioner(CaptionModel):
    """ORT / ACORT captioner; the variant is entirely in ``cfg`` (:class:`~edgecap.workshop.models.ObjectRelationCfg`).

    State (batch-first; ``L`` decoder positions, ``U`` unique decoder layers, ``T`` tokens decoded so far):

    - ``memory_bias`` (B, 1, 1, N): 0 for valid regions, −1e4 for padding;
    - ``cross_k`` (B, U, H, N, d_k) and, unless Share-KV, ``cross_v``: cross-attention keys/values, computed once
      per image and per unique layer (positions sharing a layer would hold identical copies);
    - these three may also come with one row per image for R = G·k hypotheses (:attr:`image_state_names`);
    - ``self_k`` (B, L, H, T, d_k) and, unless Share-KV, ``self_v``: the self-attention cache, one entry per
      layer position; T = 0 after :meth:`start`, and the next token's position is T.
    """

    def __init__(self, cfg: ObjectRelationCfg, vocab_size: int) -> None:
        super().__init__(cfg, vocab_size, cfg.feature_dim)
        d = cfg.d_model
        self.feature_embed = nn.Sequential(nn.Linear(cfg.feature_dim, d), nn.ReLU(), nn.Dropout(cfg.feature_dropout))
        self.encoder = TransformerEncoder(
            cfg.enc_layer_map,
            d,
            cfg.heads,
            cfg.enc_widths,
            cfg.dropout,
            cfg.share_att,
            cfg.layer_norm,
            cfg.geometry_dim if cfg.geometry else None,
            cfg.d_head,
        )
        self.embed = TokenEmbedding(vocab_size, d, cfg.max_len, cfg.dropout)
        self.decoder = TransformerDecoder(
            cfg.dec_layer_map, d, cfg.heads, cfg.dec_widths, cfg.dropout, cfg.share_att, cfg.layer_norm, cfg.d_head
        )
        self.output_proj = nn.Linear(d, vocab_size)
        self._separate_values = cfg.share_att != "kv"
        self._init_length_control(cfg.length_levels, d)  # LaBERT §3.1, Eq. 2: e_l added to every token embedding
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform on every matrix, as the reference initialises (biases and norms keep their defaults)."""
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    @property
    def state_names(self) -> tuple[str, ...]:
        names: tuple[str, ...] = ("memory_bias", "cross_k", "cross_v", "self_k", "self_v")
        if not self._separate_values:
            names = ("memory_bias", "cross_k", "self_k")
        return self._with_level_state(names)

    @property
    def image_state_names(self) -> tuple[str, ...]:
        return tuple(n for n in ("memory_bias", "cross_k", "cross_v") if n in self.state_names)

    def _encode_memory_impl(
        self, features: torch.Tensor, boxes: torch.Tensor, feature_mask: torch.Tensor | None
    ) -> torch.Tensor:
        x = self.feature_embed(features)
        geometry = None
        if self.cfg.geometry:
            geometry = box_relational_angles(boxes, self.cfg.geometry_dim, self.cfg.box_wh_offset)
        return self.encoder(x, mask_to_bias(feature_mask, x), geometry)

    def _start_impl(
        self, memory: torch.Tensor, feature_mask: torch.Tensor | None, length_level: torch.Tensor | None = None
    ) -> State:
        cross_k, cross_v = self.decoder.project_memory(memory)
        state = {"memory_bias": mask_to_bias(feature_mask, memory), "cross_k": cross_k}
        if cross_v is not None:
            state["cross_v"] = cross_v
        state["self_k"] = self.decoder.empty_cache(memory)
        if self._separate_values:
            state["self_v"] = self.decoder.empty_cache(memory)
        if length_level is not None:
            state["level_embed"] = self._level(length_level)
        return state

    def _step_impl(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        position = state["self_k"].shape[3]
        x = self.embed(tokens[:, None], start=position, extra=state.get("level_embed"))
        h, self_k, self_v = self.decoder.step(
            x,
            state["self_k"],
            state.get("self_v"),
            state["cross_k"],
            state.get("cross_v"),
            state["memory_bias"],
        )
        new_state = dict(state)
        new_state["self_k"] = self_k
        if self_v is not None:
            new_state["self_v"] = self_v
        return torch.log_softmax(self.output_proj(h[:, 0]), dim=-1), new_state

    def _decode_full_impl(
        self,
        memory: torch.Tensor,
        feature_mask: torch.Tensor | None,
        tokens: torch.Tensor,
        length_level: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # No token-padding mask: captions are right-padded, so under the causal mask no real position attends to a
        # pad, and leaving it out keeps this path identical to step() (pad positions are ignored by the loss).
        cross_k, cross_v = self.decoder.project_memory(memory)
        x = self.embed(tokens, extra=self._level(length_level))
        h = self.decoder(x, cross_k, cross_v, mask_to_bias(feature_mask, memory))
        return torch.log_softmax(self.output_proj(h), dim=-1)


register_family(
    "ort",
    ObjectRelationCfg,
    ORTCaptioner,
    FamilyHooks(export_spec="edgecap.workshop.export.specs.ort:ort_export_spec", static_step=True),
)

# Decoder positions: BOS + up to 30 words (+1 digit per extra radix token): word 31, radix (2 digits/word) 61.
_WORD_MAX_LEN = 31
_RADIX_MAX_LEN = 61
_SIX = (0, 1, 2, 3, 4, 5)


def _ort(**kw: Any) -> ObjectRelationCfg:
    return ObjectRelationCfg(
        **{"family": "ort", "vocab_kind": "word", "share_att": None, "max_len": _WORD_MAX_LEN, **kw}
    )


def _acort(**kw: Any) -> ObjectRelationCfg:
    base: dict[str, Any] = {
        "family": "ort",
        "vocab_kind": "radix",
        "radix_base": 768,
        "share_att": "kv",
        "max_len": _RADIX_MAX_LEN,
    }
    return ObjectRelationCfg(**{**base, **kw})


# -- ORT baselines (ACORT Table 1, top) ------------------------------------------------------------------------------
@register_model(paper_params=55.4e6)
def ort_base() -> ObjectRelationCfg:
    """6+6 independent layers, d=512, MLP 2048, no sharing, word vocabulary."""
    return _ort(d_model=512, d_ff=2048, enc_layer_map=_SIX, dec_layer_map=_SIX)


@register_model(paper_params=40.7e6)
def ort_base_4() -> ObjectRelationCfg:
    """ORT-base with 4 layers per side."""
    return _ort(d_model=512, d_ff=2048, enc_layer_map=(0, 1, 2, 3), dec_layer_map=(0, 1, 2, 3))


@register_model(paper_params=26.0e6)
def ort_base_2() -> ObjectRelationCfg:
    """ORT-base with 2 layers per side."""
    return _ort(d_model=512, d_ff=2048, enc_layer_map=(0, 1), dec_layer_map=(0, 1))


@register_model(paper_params=16.7e6)
def ort_small() -> ObjectRelationCfg:
    """6+6 layers at d=256, MLP 1024."""
    return _ort(d_model=256, d_ff=1024, enc_layer_map=_SIX, dec_layer_map=_SIX)


@register_model(paper_params=4.1e6)
def ort_xsmall() -> ObjectRelationCfg:
    """6+6 layers at d=104 (8 heads of 13), MLP 416; the paper reports unstable training."""
    return _ort(d_model=104, d_ff=416, enc_layer_map=_SIX, dec_layer_map=_SIX)


# -- ACORT (ACORT Table 1, bottom; §4.4) -----------------------------------------------------------------------------
@register_model(paper_params=15.0e6)
def acort_base() -> ObjectRelationCfg:
    """d=512, (0x3,1x3) sharing in encoder and decoder, Share-KV, radix base 768 (14,979,347 parameters)."""
    return _acort(d_model=512, d_ff=2048, enc_layer_map="(0x3,1x3)", dec_layer_map="(0x3,1x3)")


@register_model(paper_params=8.4e6)
def acort_base_al() -> ObjectRelationCfg:
    """ACORT-base with ALBERT-style (0x6) sharing: one layer per side, run six times."""
    return _acort(d_model=512, d_ff=2048, enc_layer_map="(0x6)", dec_layer_map="(0x6)")


@register_model(paper_params=4.2e6)
def acort_small() -> ObjectRelationCfg:
    """d=256, MLP 1024, (0x3,1x3) sharing, Share-KV, radix 768 (4,213,779 parameters)."""
    return _acort(d_model=256, d_ff=1024, enc_layer_map="(0x3,1x3)", dec_layer_map="(0x3,1x3)")


@register_model(paper_params=2.57e6)
def acort_xsmall() -> ObjectRelationCfg:
    """d=256, MLP 1024, 2 layers per side sharing one, (0x2); Share-KV, radix 768 (2.57 M in the paper's text)."""
    return _acort(d_model=256, d_ff=1024, enc_layer_map="(0x2)", dec_layer_map="(0x2)")


# -- length-controllable variants (LaBERT §3.1 / Table 1: a length-level embedding added to the token embeddings) ---
# Any ORT/ACORT model becomes one with ``--set length_levels=4level`` (or ``5level``); these are the named ones.
@register_model
def ort_base_len() -> ObjectRelationCfg:
    """ORT-base with the 4-level length embedding; decoding takes ``length_level``."""
    return ort_base().replace(length_levels="4level")


@register_model
def acort_base_len() -> ObjectRelationCfg:
    """ACORT-base with the 4-level length embedding."""
    return acort_base().replace(length_levels="4level")


@register_model
def acort_small_len() -> ObjectRelationCfg:
    """ACORT-small with the 4-level length embedding."""
    return acort_small().replace(length_levels="4level")


@register_model
def acort_xsmall_len() -> ObjectRelationCfg:
    """ACORT-xsmall with the 4-level length embedding (1,280 extra parameters at d=256)."""
    return acort_xsmall().replace(length_levels="4level")


# -- tiny configs for tests (timm's *_test habit) --------------------------------------------------------------------
@register_model
def ort_test() -> ObjectRelationCfg:
    """d=32, 2 heads, 2 independent layers per side, word vocabulary."""
    return _ort(d_model=32, d_ff=64, heads=2, enc_layer_map=(0, 1), dec_layer_map=(0, 1))


@register_model
def acort_test() -> ObjectRelationCfg:
    """d=32, 2 heads, (0x2) sharing on both sides, Share-KV, radix 768: every ACORT mechanism at toy size."""
    return _acort(d_model=32, d_ff=64, heads=2, enc_layer_map="(0x2)", dec_layer_map="(0x2)")


@register_model
def acort_test_qk() -> ObjectRelationCfg:
    """acort-test with Share-QK (ACORT Table 10) and (0,0,1) maps: sharing next to an independent layer."""
    return _acort(d_model=32, d_ff=64, heads=2, enc_layer_map=(0, 0, 1), dec_layer_map=(0, 0, 1), share_att="qk")


@register_model
def acort_test_len() -> ObjectRelationCfg:
    """acort-test with the 4-level length embedding (length control at toy size)."""
    return acort_test().replace(length_levels="4level")
