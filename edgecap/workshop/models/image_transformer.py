"""Image Transformer (He, Liao et al., "Image Captioning through Image Transformer", ACCV 2020).

Architecture (§3.2-3.3; where the paper is silent, as its released code, dropout included):

- visual features (B, N, C) -> ``ReLU(Linear(C, d))`` -> dropout; with ``grid_scales`` the encoder appends coarse
  grid cells (:func:`~edgecap.workshop.models.layers.spatial_graph.multiscale_cells`) so a backbone grid has nested
  cells,
  by default only to images whose boxes tile the image (``grid_scales_on="grid"``): regions keep the paper's graph;
- spatial-graph relations from the boxes (Eq. 5, ε = 0.9; :mod:`edgecap.workshop.models.layers.spatial_graph`);
- ``enc_layers`` spatial-graph encoder layers (Eq. 6-7): one shared query, one key/value projection per relation,
  the relation masks multiplied into the (dropped-out) softmax weights (Eq. 6: a Hadamard product, no
  renormalisation), the three relation outputs summed, then the AoA/GLU refinement ``GLU(W Drop([att; q]))``;
  pre-LN residual ``x + Drop(f(LN(x)))``, no feed-forward sub-layer, a final LayerNorm;
- decoder (Eq. 8-11): ``x_t = [E y_t ; Ā + c_{t−1}]`` -> LSTM -> ``q = W_Q LN(h_t)`` -> M implicit attention branches
  over the memory, each with its own key/value projection (Eq. 9), averaged -> ``c_t = GLU(W [att; h_t])`` (Eq. 10)
  -> ``Linear(d, V)`` -> log-softmax (Eq. 11).

Departures, on purpose (``docs/image-transformer.md``; ``image-transformer-ref`` switches the first three back to
the released code): ``nn.LayerNorm`` (``layer_norm``); the overlap of disjoint boxes is clamped at zero
(``relation_labels``); coarse grid cells on grid features (``grid_scales``); relations
are computed inside the model from the boxes (no offline per-image files) with tensor ops only, so the encoder runs
on any device and exports; the branches' keys and values are projected once per image in :meth:`start` (the released
code recomputes them every step); padding is masked with −1e4 (fp16-safe); the multi-scale grid cells (edgecap's
addition) take part in the encoder only, and the decoder attends to the input cells.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F

from edgecap.workshop.models._image_transformer_cfg import ImageTransformerCfg
from edgecap.workshop.models._registry import FamilyHooks, register_family, register_model
from edgecap.workshop.models.base import CaptionModel, State
from edgecap.workshop.models.layers.attention import attention_weights, mask_to_bias
from edgecap.workshop.models.layers.norm import make_norm
from edgecap.workshop.models.layers.spatial_graph import RELATIONS, multiscale_cells, spatial_relations, tiles_image

__all__ = ["ImageTransformerCaptioner", "ImageTransformerCfg", "SpatialGraphLayer"]


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, N, d) -> (B, H, N, d / H)."""
    batch, length, dim = x.shape
    return x.reshape(batch, length, heads, dim // heads).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    """(B, H, N, d_k) -> (B, N, H · d_k)."""
    batch, heads, length, dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * dim)


class AoAGate(nn.Module):
    """Attention on attention (the paper's GLU refinement, §4.4): ``GLU(W [att; q] + b)``, d -> d."""

    def __init__(self, dim: int, dropout: float) -> None:
        super().__init__()
        self.proj = nn.Linear(2 * dim, 2 * dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, attended: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        return F.glu(self.proj(self.dropout(torch.cat((attended, query), dim=-1))), dim=-1)


class SpatialGraphLayer(nn.Module):
    """One spatial-graph encoder layer (Eq. 6-7): ``x + Drop(AoA(Σ_r (Ω_r ∘ Drop(softmax(Q K_rᵀ/√d_k))) V_r, LN(x)))``.

    Without relations (``masks`` None) the branches are unmasked and averaged, the paper's "w/o spatial relations"
    ablation (§4.4). The three dropouts sit where the released code has them: on each relation's attention weights
    (``attention_dropout``), on the AoA gate input (``gate_dropout``) and on the sub-layer output
    (``residual_dropout``).
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        gate_dropout: float,
        attention_dropout: float,
        residual_dropout: float,
        layer_norm: str = "standard",
    ) -> None:
        super().__init__()
        self.heads = heads
        self.norm = make_norm(layer_norm, dim)
        self.query = nn.Linear(dim, dim)
        self.keys = nn.ModuleList(nn.Linear(dim, dim) for _ in RELATIONS)
        self.values = nn.ModuleList(nn.Linear(dim, dim) for _ in RELATIONS)
        self.attention_dropout = nn.Dropout(attention_dropout)
        self.gate = AoAGate(dim, gate_dropout)
        self.dropout = nn.Dropout(residual_dropout)

    def forward(self, x: torch.Tensor, bias: torch.Tensor, masks: torch.Tensor | None) -> torch.Tensor:
        """``x`` (B, N, d), ``bias`` (B, 1, 1, N) padding bias, ``masks`` (B, 3, N, N) relation masks or None."""
        h = self.norm(x)
        q = _heads(self.query(h), self.heads)
        attended = None
        for r, (key, value) in enumerate(zip(self.keys, self.values, strict=True)):
            weights = self.attention_dropout(attention_weights(q, _heads(key(h), self.heads), bias))
            if masks is not None:
                weights = weights * masks[:, r : r + 1]  # Eq. 6: Hadamard product after the softmax
            out = torch.matmul(weights, _heads(value(h), self.heads))
            attended = out if attended is None else attended + out
        if masks is None:
            attended = cast(torch.Tensor, attended) / len(RELATIONS)  # RELATIONS is not empty
        return x + self.dropout(self.gate(_merge(attended), h))


class ImageTransformerCaptioner(CaptionModel):
    """Image Transformer captioner; the variant is entirely in ``cfg`` (:class:`ImageTransformerCfg`).

    State (batch-first; ``M`` implicit branches, ``H`` heads):

    - ``memory_bias`` (B, 1, 1, N): 0 for valid regions, −1e4 for padding;
    - ``branch_k``, ``branch_v`` (B, M, H, N, d_k): every branch's keys and values (Eq. 9), projected once per image;
    - ``memory_mean`` (B, d): Ā, the mean of the memory over valid regions (Eq. 8);
    - ``lstm_h``, ``lstm_c`` (B, d): the LSTM's hidden and cell state; ``context`` (B, d): ``c_{t−1}`` (Eq. 10);
      zero after :meth:`start`, replaced by every step;
    - ``level_embed`` (B, 1, d), only for a length-controllable model: the level embedding (LaBERT Eq. 2) added to
      every word embedding.

    Nothing grows with the caption: a step costs the same at every position.
    """

    def __init__(self, cfg: ImageTransformerCfg, vocab_size: int) -> None:
        super().__init__(cfg, vocab_size, cfg.feature_dim)
        d = cfg.d_model
        self.feature_embed = nn.Sequential(nn.Linear(cfg.feature_dim, d), nn.ReLU(), nn.Dropout(cfg.feature_dropout))
        self.encoder = nn.ModuleList(
            SpatialGraphLayer(d, cfg.heads, cfg.dropout, cfg.attention_dropout, cfg.residual_dropout, cfg.layer_norm)
            for _ in range(cfg.enc_layers)
        )
        self.encoder_norm = make_norm(cfg.layer_norm, d)
        self.embed = nn.Embedding(vocab_size, d)
        self.lstm = nn.LSTMCell(2 * d, d)  # parameters only: the cell is written out in _lstm so that it exports
        self.query_norm = make_norm(cfg.layer_norm, d)
        self.query = nn.Linear(d, d)
        self.branches = nn.ModuleList(nn.Linear(d, 2 * d) for _ in range(cfg.branches))
        self.attention_dropout = nn.Dropout(cfg.attention_dropout)  # on each branch's weights, as the released code
        self.context = nn.Linear(2 * d, 2 * d)
        self.output_dropout = nn.Dropout(cfg.output_dropout)
        self.output_proj = nn.Linear(d, vocab_size)
        self._init_length_control(cfg.length_levels, d)  # LaBERT §3.1, Eq. 2: e_l added to every word embedding

    @property
    def state_names(self) -> tuple[str, ...]:
        names = ("memory_bias", "branch_k", "branch_v", "memory_mean", "lstm_h", "lstm_c", "context")
        return self._with_level_state(names)

    # -- encoder ---------------------------------------------------------------------------------------------------
    def _encode_memory_impl(
        self, features: torch.Tensor, boxes: torch.Tensor, feature_mask: torch.Tensor | None
    ) -> torch.Tensor:
        x = self.feature_embed(features)
        mask = feature_mask
        if self.cfg.grid_scales:
            # grid features tile the image, so Eq. 5 finds no nesting there; regions nest already and keep the paper's
            # graph: the coarse cells of an image whose boxes do not tile it are padding
            active = tiles_image(boxes, feature_mask) if self.cfg.grid_scales_on == "grid" else None
            x, boxes, mask = multiscale_cells(x, boxes.to(x.dtype), feature_mask, self.cfg.grid_scales, active)
        cfg = self.cfg
        masks = spatial_relations(boxes, cfg.overlap_eps, cfg.relation_labels).to(x.dtype) if cfg.relations else None
        bias = mask_to_bias(mask, x)
        for layer in self.encoder:
            x = layer(x, bias, masks)
        return self.encoder_norm(x)[:, : features.shape[1]]

    # -- decoder ---------------------------------------------------------------------------------------------------
    def _start_impl(
        self, memory: torch.Tensor, feature_mask: torch.Tensor | None, length_level: torch.Tensor | None = None
    ) -> State:
        heads = self.cfg.heads
        keys, values = [], []
        for branch in self.branches:
            k, v = branch(memory).chunk(2, dim=-1)
            keys.append(_heads(k, heads))
            values.append(_heads(v, heads))
        if feature_mask is None:
            mean = memory.mean(dim=1)
        else:
            weight = feature_mask.to(memory.dtype)[..., None]
            mean = (memory * weight).sum(dim=1) / weight.sum(dim=1).clamp(min=1.0)
        state = {
            "memory_bias": mask_to_bias(feature_mask, memory),
            "branch_k": torch.stack(keys, dim=1),
            "branch_v": torch.stack(values, dim=1),
            "memory_mean": mean,
            "lstm_h": torch.zeros_like(mean),
            "lstm_c": torch.zeros_like(mean),
            "context": torch.zeros_like(mean),
        }
        if length_level is not None:
            state["level_embed"] = self._level(length_level)
        return state

    def _lstm(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``nn.LSTMCell`` written out (gate order i, f, g, o), so export sees MatMul/Sigmoid/Tanh only."""
        cell = self.lstm
        gates = F.linear(x, cell.weight_ih, cell.bias_ih) + F.linear(h, cell.weight_hh, cell.bias_hh)
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def _cell(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One decoding step (Eq. 8-11) for ``tokens`` (B,): (log-probs (B, V), the replaced recurrent entries)."""
        word = self.output_dropout(torch.relu(self.embed(tokens)))
        level = state.get("level_embed")
        if level is not None:
            word = word + level[:, 0]
        x = torch.cat((word, state["memory_mean"] + self.output_dropout(state["context"])), dim=-1)
        h, c = self._lstm(x, state["lstm_h"], state["lstm_c"])
        q = self.query(self.query_norm(h))  # (B, d)
        batch, dim = q.shape
        q = q.reshape(batch, 1, self.cfg.heads, 1, dim // self.cfg.heads)  # (B, 1, H, 1, d_k), shared by the branches
        scores = torch.matmul(q, state["branch_k"].transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        weights = self.attention_dropout(torch.softmax(scores + state["memory_bias"][:, None], dim=-1))  # (B,M,H,1,N)
        attended = torch.matmul(weights, state["branch_v"]).mean(dim=1)  # Eq. 10: the mean over the M branches
        context = F.glu(self.context(torch.cat((attended.reshape(batch, dim), h), dim=-1)), dim=-1)
        logprobs = torch.log_softmax(self.output_proj(self.output_dropout(context)), dim=-1)
        return logprobs, {"lstm_h": h, "lstm_c": c, "context": context}

    def _step_impl(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        logprobs, recurrent = self._cell(tokens, state)
        return logprobs, {**state, **recurrent}

    def _decode_full_impl(
        self,
        memory: torch.Tensor,
        feature_mask: torch.Tensor | None,
        tokens: torch.Tensor,
        length_level: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # The LSTM is sequential, so teacher forcing is the step loop itself: identical to cached decoding by
        # construction. Right-padded captions only feed pads after the last word, whose outputs the loss ignores.
        state = self._start_impl(memory, feature_mask, length_level)
        outputs = []
        for t in range(tokens.shape[1]):
            logprobs, recurrent = self._cell(tokens[:, t], state)
            state.update(recurrent)
            outputs.append(logprobs)
        return torch.stack(outputs, dim=1)


register_family(
    "image_transformer",
    ImageTransformerCfg,
    ImageTransformerCaptioner,
    FamilyHooks(export_spec="edgecap.workshop.export.specs.image_transformer:image_transformer_export_spec"),
)


# -- named variants ----------------------------------------------------------------------------------------------------
@register_model
def image_transformer() -> ImageTransformerCfg:
    """The paper's settings (§3.2, §4.2 and the released code): d 1024, 8 heads, 3 spatial-graph layers, M = 3;
    82,121,858 parameters on 2,048-d regions with 10,369 words + 1 (``docs/image-transformer.md``)."""
    return ImageTransformerCfg(d_model=1024, heads=8, enc_layers=3, branches=3)


@register_model
def image_transformer_small() -> ImageTransformerCfg:
    """Edge variant: d 384, 8 heads, 3 layers, M = 3; 8.87 M parameters on the default grid with a 124-word
    vocabulary (expansionnet-v2-small: 8.07 M)."""
    return ImageTransformerCfg(d_model=384, heads=8, enc_layers=3, branches=3)


@register_model
def image_transformer_xsmall() -> ImageTransformerCfg:
    """Edge variant: d 224, 8 heads, 2 layers, M = 3; 2.61 M parameters on the default grid with a 124-word
    vocabulary (acort-xsmall: 2.37 M, expansionnet-v2-xsmall: 2.79 M)."""
    return ImageTransformerCfg(d_model=224, heads=8, enc_layers=2, branches=3)


@register_model
def image_transformer_test() -> ImageTransformerCfg:
    """d 32, 2 heads, 2 layers, M = 2, 2×2 + 1×1 grid scales (on grid features): every mechanism at toy size."""
    return ImageTransformerCfg(d_model=32, heads=2, enc_layers=2, branches=2, grid_scales=(2, 1))


# -- length-controllable variants (LaBERT §3.1: a length-level embedding added to the word embeddings) ---------------
@register_model
def image_transformer_len() -> ImageTransformerCfg:
    """image-transformer with the 4-level length embedding; decoding takes ``length_level``."""
    return image_transformer().replace(length_levels="4level")


@register_model
def image_transformer_small_len() -> ImageTransformerCfg:
    """image-transformer-small with the 4-level length embedding."""
    return image_transformer_small().replace(length_levels="4level")


@register_model
def image_transformer_xsmall_len() -> ImageTransformerCfg:
    """image-transformer-xsmall with the 4-level length embedding (1,120 extra parameters at d = 224)."""
    return image_transformer_xsmall().replace(length_levels="4level")


@register_model
def image_transformer_test_len() -> ImageTransformerCfg:
    """image-transformer-test with the 4-level length embedding (length control at toy size)."""
    return image_transformer_test().replace(length_levels="4level")
