"""LaBERT (Deng et al., "Length-Controllable Image Captioning", ECCV 2020): a BERT-style bidirectional Transformer
over ``[visual tokens; caption tokens]`` that predicts masked caption tokens in parallel (§3.2, Fig. 2).

Inputs (§3.1–3.2):

- caption token at position i: ``WordEmb(s_i) + PosEmb(i) + TypeEmb(l)`` where the length-level embedding ``e_l``
  is BERT's token-type table row ``l`` (Eq. 2; the official code reuses the type table the same way);
- visual token r: ``W_e f_r + W_p LN(loc_r) + e_img`` (Eq. 3) with ``loc_r`` = normalised corners + relative area
  (the 5-tuple of §4.2) and ``e_img`` = type row ``k + 1``;
- both streams share BERT's embedding LayerNorm + dropout, are concatenated and run through post-LN BERT layers
  (GELU FFN) with no causal mask; a BERT LM head (dense + GELU + LN + untied decoder) gives ``(B, L, V)``.

Deployable split (what ``edgecap.workshop.export.specs.labert`` exports): ``encode`` -> ``visual`` (B, N, d) embedded
visual
tokens and ``visual_bias`` (B, N) key-padding bias, computed once per image; ``refine(tokens (B, L),
length_level (B,), state)`` -> log-probs (B, L, V), one full pass per mask-predict step. Unlike an autoregressive
decoder nothing is cached between steps: every visual token attends to the (changing) caption tokens.

``[MASK]`` is an input-only id equal to ``vocab_size`` (the embedding table has ``V + 1`` rows; the head predicts
only the ``V`` vocabulary classes), so LaBERT uses the same word vocabulary as the other families.

Departures from the paper, on purpose:

- **Random initialisation** (BERT-style N(0, 0.02)): BERT-base weights cannot be downloaded here, so even
  ``labert-base`` (12 layers, 768 hidden, 12 heads, FFN 3072 = BERT-base's shape) starts from scratch.
- No class-probability term ``LN(f_c)`` in Eq. 3: edgecap's grid features (and region stores without detector
  class scores) have none; the location term keeps the 5-tuple.
- Positions: a learned table of ``max_len`` = the last level's ``L_high`` rows (BERT-base has 512), so the
  parameter count is BERT-base's minus 487 position rows.
- Visual embedding: the paper's single linear ``W_e`` (the official code uses a 2-layer MLP).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from edgecap.runtime.length import check_level
from edgecap.workshop.models._labert_cfg import LaBertCfg
from edgecap.workshop.models._registry import FamilyHooks, register_family, register_model
from edgecap.workshop.models.layers.attention import MultiHeadAttention, mask_to_bias

__all__ = ["LaBertCaptioner", "LaBertCfg"]

State = dict[str, torch.Tensor]


class BertLayer(nn.Module):
    """Post-LN Transformer layer as in BERT: ``LN(x + Attn(x))`` then ``LN(x + FFN_GELU(x))``."""

    def __init__(self, dim: int, heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(dim, heads, None, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-12), nn.LayerNorm(dim, eps=1e-12)
        self.fc1, self.fc2 = nn.Linear(dim, d_ff), nn.Linear(d_ff, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.attn(x, bias=bias)))
        return self.norm2(x + self.dropout(self.fc2(nn.functional.gelu(self.fc1(x)))))


def _exporting() -> bool:
    return bool(torch.compiler.is_compiling() or torch.compiler.is_exporting())


class LaBertCaptioner(nn.Module):
    """LaBERT; see the module docstring. State: ``visual`` (B, N, d), ``visual_bias`` (B, N) (0 valid, −1e4 pad).

    Attributes:
        mask_id: the input-only ``[MASK]`` id (= ``vocab_size``).
        levels: the cfg's length levels (1-based in every public argument).
    """

    state_names: tuple[str, ...] = ("visual", "visual_bias")

    def __init__(self, cfg: LaBertCfg, vocab_size: int) -> None:
        super().__init__()
        self.cfg, self.vocab_size, self.feature_dim = cfg, vocab_size, cfg.feature_dim
        self.levels = cfg.levels
        self.mask_id = vocab_size
        d, k = cfg.d_model, len(cfg.levels)
        self.word_embed = nn.Embedding(vocab_size + 1, d)
        self.pos_embed = nn.Embedding(cfg.max_len, d)
        # BERT's token-type table: row 0 unused (padding), rows 1..k length levels (Eq. 2), row k+1 e_img (Eq. 3).
        self.type_embed = nn.Embedding(k + 2, d)
        self.visual_proj = nn.Linear(cfg.feature_dim, d)
        self.loc_norm = nn.LayerNorm(5)
        self.loc_proj = nn.Linear(5, d)
        self.embed_norm = nn.LayerNorm(d, eps=1e-12)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(BertLayer(d, cfg.heads, cfg.d_ff, cfg.dropout) for _ in range(cfg.layers))
        self.head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d, eps=1e-12))
        self.output_proj = nn.Linear(d, vocab_size)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorms (random init: no BERT weights)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)

    @property
    def max_len(self) -> int:
        return self.cfg.max_len

    # -- encode: the visual tokens (Eq. 3), once per image ---------------------------------------------------------
    def encode(self, features: torch.Tensor, boxes: torch.Tensor, feature_mask: torch.Tensor | None = None) -> State:
        """``features`` (B, N, C), ``boxes`` (B, N, 4) normalised corners, ``feature_mask`` (B, N) bool -> state."""
        if features.dim() != 3 or (isinstance(features.shape[-1], int) and features.shape[-1] != self.feature_dim):
            raise ValueError(f"features must be (B, N, {self.feature_dim}), got {tuple(features.shape)}")
        if boxes.dim() != 3 or boxes.shape[-1] != 4:
            raise ValueError(f"boxes must be (B, N, 4), got {tuple(boxes.shape)}")
        area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
        loc = torch.cat((boxes, area[..., None]), dim=-1)
        image_type = self.type_embed.weight[len(self.levels) + 1]
        x = self.visual_proj(features) + self.loc_proj(self.loc_norm(loc)) + image_type
        visual = self.dropout(self.embed_norm(x))
        return {"visual": visual, "visual_bias": mask_to_bias(feature_mask, visual).flatten(1)}

    # -- refine: one mask-predict pass --------------------------------------------------------------------------------
    def refine(
        self, tokens: torch.Tensor, length_level: torch.Tensor, state: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        """``tokens`` (B, L) (``mask_id`` where masked), ``length_level`` (B,) in 1..k -> log-probs (B, L, V)."""
        if tokens.dim() != 2 or tokens.is_floating_point():
            raise ValueError(f"tokens must be an integer tensor (B, L), got {tokens.dtype} {tuple(tokens.shape)}")
        if isinstance(tokens.shape[1], int) and tokens.shape[1] > self.max_len:
            raise ValueError(f"{tokens.shape[1]} caption positions exceed max_len={self.max_len}")
        if length_level.dim() != 1:
            raise ValueError(f"length_level must be (B,), got {tuple(length_level.shape)}")
        if not _exporting():
            bad = (length_level < 1) | (length_level > len(self.levels))
            if bool(bad.any()):
                check_level(self.levels, int(length_level[bad][0]))
        visual, visual_bias = state["visual"], state["visual_bias"]
        length = tokens.shape[1]
        text = self.word_embed(tokens) + self.pos_embed.weight[:length] + self.type_embed(length_level)[:, None]
        text = self.dropout(self.embed_norm(text))
        x = torch.cat((visual, text), dim=1)
        text_bias = torch.zeros_like(tokens, dtype=visual_bias.dtype)
        bias = torch.cat((visual_bias, text_bias), dim=1)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, bias)
        h = x[:, visual.shape[1] :]
        return torch.log_softmax(self.output_proj(self.head(h)), dim=-1)

    def forward(
        self,
        features: torch.Tensor,
        boxes: torch.Tensor,
        feature_mask: torch.Tensor | None,
        tokens: torch.Tensor,
        length_level: torch.Tensor,
    ) -> torch.Tensor:
        """Training pass: ``encode`` then ``refine`` -> log-probs (B, L, V)."""
        return self.refine(tokens, length_level, self.encode(features, boxes, feature_mask))

    @staticmethod
    def select_state(state: Mapping[str, torch.Tensor], index: torch.Tensor) -> State:
        return {name: value.index_select(0, index) for name, value in state.items()}


def _build(cfg: LaBertCfg, vocab_size: int) -> LaBertCaptioner:
    return LaBertCaptioner(cfg, vocab_size)


register_family(
    "labert",
    LaBertCfg,
    _build,
    FamilyHooks(
        decoding="mask_predict",  # §3.2: non-autoregressive refinement at a chosen length level
        objective="edgecap.workshop.training.objectives:masked_lm",  # §3.2, Eq. 4
        torch_decoder="edgecap.workshop.torch_runtime.refine:TorchRefineModel",
        export_spec="edgecap.workshop.export.specs.labert:labert_export_spec",
    ),
)


def _labert(**kw: Any) -> LaBertCfg:
    return LaBertCfg(**kw)


# -- the paper's size (§4.2): BERT-base shape, random init ------------------------------------------------------------
@register_model
def labert_base() -> LaBertCfg:
    """12 layers, 768 hidden, 12 heads, FFN 3072 (BERT-base shape, **random init**), 4-level plan (§4.4)."""
    return _labert(d_model=768, layers=12, heads=12, d_ff=3072, levels="4level")


@register_model
def labert_base_5level() -> LaBertCfg:
    """labert-base with the 5-level plan ([1,9], [10,13], [14,17], [18,21], [22,25]; Table 1)."""
    return _labert(d_model=768, layers=12, heads=12, d_ff=3072, levels="5level")


# -- compact edge sizes -----------------------------------------------------------------------------------------------
@register_model
def labert_small() -> LaBertCfg:
    """4 layers, 256 hidden, 4 heads, FFN 1024, 4-level plan."""
    return _labert(d_model=256, layers=4, heads=4, d_ff=1024)


@register_model
def labert_xsmall() -> LaBertCfg:
    """2 layers, 256 hidden, 4 heads, FFN 1024, 4-level plan (about ACORT-xsmall's decoder budget)."""
    return _labert(d_model=256, layers=2, heads=4, d_ff=1024)


@register_model
def labert_test() -> LaBertCfg:
    """d=32, 2 heads, 2 layers: every LaBERT mechanism at toy size (tests)."""
    return _labert(d_model=32, layers=2, heads=2, d_ff=64)


def parameter_summary(model: LaBertCaptioner) -> dict[str, int]:
    """Parameters per part (embeddings, layers, head) for docs."""
    parts: dict[str, int] = {}
    for name, p in model.named_parameters():
        key = name.split(".")[0]
        parts[key] = parts.get(key, 0) + p.numel()
    return parts
