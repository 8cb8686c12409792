"""``ImageTransformerCfg``: the architecture of an Image Transformer captioner as one frozen, JSON-round-trippable
dataclass (the registry's ``FamilyCfg`` protocol)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgecap.workshop.models._cfg import (
    VOCAB_KINDS,
    FamilyCfg,
    ModelCfgError,
    check_fractions,
    check_positive_ints,
    optional_length_levels,
)
from edgecap.workshop.models.layers.norm import NORM_KINDS
from edgecap.workshop.models.layers.spatial_graph import OVERLAP_EPS, RELATION_LABELS

__all__ = ["GRID_SCALES_ON", "PAPER_IT_VOCAB_SIZE", "ImageTransformerCfg"]

#: The paper's COCO vocabulary (§4.2 / the released code: words seen at least 4 times) plus the one special id.
PAPER_IT_VOCAB_SIZE = 10369 + 1
#: Which inputs get the multi-scale cells: images whose boxes tile the image (a backbone grid), or every image.
GRID_SCALES_ON = ("grid", "all")


def _scales(value: Any) -> tuple[int, ...]:
    """``grid_scales`` from a tuple, a list, an int or CLI text (``"3,1"``; ``"none"``/``""`` for none)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "")):
        return ()
    if isinstance(value, str):
        try:
            value = tuple(int(v) for v in value.replace(" ", "").split(",") if v)
        except ValueError as exc:
            raise ModelCfgError(f"ImageTransformerCfg.grid_scales: cannot parse {value!r}") from exc
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (list, tuple)) or any(
        not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in value
    ):
        raise ModelCfgError(f"ImageTransformerCfg.grid_scales must be positive integers, got {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class ImageTransformerCfg(FamilyCfg):
    """Architecture of an Image Transformer captioner (He et al., ACCV 2020).

    Attributes:
        family: ``"image_transformer"``.
        d_model, heads: width and attention heads of encoder and decoder (§4.2 / the released code: 1024, 8).
        enc_layers: spatial-graph encoder layers (§3.2: 3, half the usual 6 because each layer is three wide).
        branches: M, the implicit decoding sub-transformers (§3.3 Eq. 9-10; Table 3: 3 is best).
        relations: apply the spatial-graph masks (Eq. 6-7); off is the paper's "w/o spatial relations" ablation
            (the three branches unmasked and averaged).
        overlap_eps: ε of Eq. 5 (0.9).
        relation_labels: ``"paper"`` (Eq. 5, the overlap clamped at zero per side) or ``"official"`` (the released
            code's unclamped product: two boxes apart on both axes can be parent/child; for imported checkpoints).
        grid_scales: coarse tilings appended to the input cells inside the encoder (``(3, 1)``: a 3×3 and a 1×1
            tiling), so a backbone grid has nested cells and parent/child relations. The decoder attends to the
            input cells only (``docs/image-transformer.md``).
        grid_scales_on: ``"grid"``: only images whose valid boxes partition the image (a backbone grid) get the
            coarse cells, detector regions (which already nest) keep the paper's graph; ``"all"``: every image.
        layer_norm: ``"standard"`` (``nn.LayerNorm``; exports and fuses) or ``"annotated"`` (the released code's
            ``a·(x − μ)/(std_unbiased + 1e-6) + b``; for imported checkpoints).
        vocab_kind, radix_base: ``"word"`` (the paper) or ``"radix"``.
        feature_dim: channels of the visual features (1280: EfficientNet-Lite0 grid).
        paper_feature_dim, paper_vocab_size: the paper's setting, for ``edgecap zoo`` counts only (2,048-d
            bottom-up regions; 10,369 words + 1).
        dropout: dropout on the AoA gate input in the encoder (the released code's ``dropout_aoa`` 0.3).
        attention_dropout: dropout on the attention weights after the softmax, in the encoder (each relation) and
            the decoder (each implicit branch) (the released code's 0.1).
        residual_dropout: dropout on the encoder sub-layer output before the residual sum (the released code's
            ``SublayerConnection`` 0.1).
        feature_dropout: dropout after the feature embedding (the code's 0.5).
        output_dropout: dropout on the word embedding, on the previous context and on the context before the logits
            (the code's ``drop_prob_lm`` 0.5).
        max_len: longest token sequence fed to the decoder (BOS + words); the LSTM has no position table, so this
            only bounds decoding.
        length_levels: None or a length-level plan (``"4level"``, ...): a learned level embedding is added to every
            word embedding (LaBERT §3.1, Eq. 2), as ``ModelCfg.length_levels``.
    """

    family: str = "image_transformer"
    d_model: int = 1024
    heads: int = 8
    enc_layers: int = 3
    branches: int = 3
    relations: bool = True
    overlap_eps: float = OVERLAP_EPS
    relation_labels: str = "paper"
    grid_scales: Any = (3, 1)
    grid_scales_on: str = "grid"
    layer_norm: str = "standard"
    vocab_kind: str = "word"
    radix_base: int = 768
    feature_dim: int = 1280
    paper_feature_dim: int = 2048
    paper_vocab_size: int = PAPER_IT_VOCAB_SIZE
    dropout: float = 0.3
    attention_dropout: float = 0.1
    residual_dropout: float = 0.1
    feature_dropout: float = 0.5
    output_dropout: float = 0.5
    max_len: int = 31
    length_levels: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "length_levels", optional_length_levels(self.length_levels, "ImageTransformerCfg"))
        object.__setattr__(self, "grid_scales", _scales(self.grid_scales))
        names = ("d_model", "heads", "enc_layers", "branches", "radix_base", "feature_dim", "paper_feature_dim")
        check_positive_ints(self, (*names, "paper_vocab_size", "max_len"))
        if self.d_model % self.heads:
            raise ModelCfgError(
                f"ImageTransformerCfg.d_model ({self.d_model}) must be divisible by heads ({self.heads})"
            )
        if self.vocab_kind not in VOCAB_KINDS:
            raise ModelCfgError(f"ImageTransformerCfg.vocab_kind must be one of {VOCAB_KINDS}, got {self.vocab_kind!r}")
        if not isinstance(self.relations, bool):
            raise ModelCfgError(f"ImageTransformerCfg.relations must be true or false, got {self.relations!r}")
        eps = self.overlap_eps
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0.5 < eps <= 1.0:
            raise ModelCfgError(f"ImageTransformerCfg.overlap_eps must be in (0.5, 1], got {eps!r}")
        for name, kinds in (
            ("relation_labels", RELATION_LABELS),
            ("grid_scales_on", GRID_SCALES_ON),
            ("layer_norm", NORM_KINDS),
        ):
            if getattr(self, name) not in kinds:
                raise ModelCfgError(f"ImageTransformerCfg.{name} must be one of {kinds}, got {getattr(self, name)!r}")
        dropouts = ("dropout", "attention_dropout", "residual_dropout", "feature_dropout", "output_dropout")
        check_fractions(self, dropouts)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def summary(self) -> dict[str, Any]:
        """Architecture columns for ``edgecap zoo`` (the decoder "map" is the LSTM + M implicit branches)."""
        scales = "+".join(f"{s}x{s}" for s in self.grid_scales) or "none"
        if self.grid_scales:
            scales += f"({self.grid_scales_on})"
        graph = ("on" if self.relations else "off") + (",official" if self.relation_labels == "official" else "")
        return {
            "family": self.family,
            "d_model": self.d_model,
            "d_ff": 0,  # no feed-forward sub-layer (the released code's use_ff=0)
            "heads": self.heads,
            "enc_layers": self.enc_layers,
            "enc_unique": self.enc_layers,
            "enc_layer_map": f"graph={graph},scales={scales}",
            "dec_layers": 1,
            "dec_unique": 1,
            "dec_layer_map": f"LSTM+M={self.branches}",
            "share_att": None,
            "vocab_kind": self.vocab_kind,
            "radix_base": self.radix_base if self.vocab_kind == "radix" else None,
            "geometry": self.relations,
            "length_levels": len(self.length_levels) if self.length_levels else None,
        }
