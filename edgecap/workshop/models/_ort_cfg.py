"""``ObjectRelationCfg``: the architecture of an Object Relation Transformer captioner (ORT, Herdade et al. 2019; and
ACORT = ORT + radix tokens + parameter sharing) as one frozen, JSON-round-trippable dataclass (the registry's
``FamilyCfg``). Its family name is ``"ort"``, the paper's, as in the ``ort-*`` and ``acort-*`` model names; "ort"
never means ONNX Runtime in model code (that runtime is ``"onnxruntime"``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgecap.workshop.models._cfg import (
    VOCAB_KINDS,
    FamilyCfg,
    ModelCfgError,
    check_fractions,
    check_positive_ints,
    optional_length_levels,
)
from edgecap.workshop.models.layers.attention import SHARE_KINDS
from edgecap.workshop.models.layers.layer_map import LayerMapError, format_layer_map, parse_layer_map
from edgecap.workshop.models.layers.norm import NORM_KINDS

__all__ = ["ModelCfg", "ObjectRelationCfg"]


def _default_map() -> tuple[int, ...]:
    return (0, 1, 2, 3, 4, 5)


@dataclass(frozen=True)
class ObjectRelationCfg(FamilyCfg):
    """Architecture of an Object Relation Transformer captioner (ORT, and ACORT = ORT + radix + sharing).

    Attributes:
        family: the family builder that turns this cfg into a model (``"ort"``).
        d_model, d_ff, heads: width, FFN width and attention heads (ACORT Table 1).
        enc_layer_map, dec_layer_map: unique-layer index per position (ACORT §4.2); e.g. ``(0, 0, 0, 1, 1, 1)``.
        share_att: attention parameter sharing in every encoder and decoder attention: ``"kv"``, ``"qk"`` or None
            (ACORT §4.3; ACORT uses ``"kv"``, Table 10).
        vocab_kind: ``"word"`` or ``"radix"`` (ACORT §4.1); tells the training pipeline which vocabulary to build.
        radix_base: radix base v; a radix model has exactly ``v + 3`` output classes (PAD, v digits, BOS, EOS).
        feature_dim: channels of the visual features (1280: EfficientNet-Lite0 grid; the paper: 2048 regions).
        geometry: box-relational attention in encoder self-attention (ORT §3.2); off = plain self-attention.
        geometry_dim: size ``d_g`` of the sinusoidal box embedding (64).
        box_wh_offset: added to box widths/heights in the geometry features. The reference adds 1.0 (a pixel-
            coordinate leftover); 0.0 for fresh models, 1.0 only to port reference weights.
        dropout: residual, attention and embedding dropout (0.1).
        feature_dropout: dropout after the feature embedding (the reference's ``drop_prob_src``: 0.5 for XE).
        max_len: decoder positions = longest token sequence fed to the decoder (BOS + generated tokens); a radix
            model needs ``digits · words + 1``. Positions are a fixed table, so this bounds decoding length.
        layer_norm: ``"standard"`` (``nn.LayerNorm``; exports and fuses in TensorRT) or ``"annotated"`` (the
            reference's unbiased-std variant, for porting reference weights). Fresh models use ``"standard"``.
        length_levels: None (no length control) or a length-level plan (``"4level"``, ``"5level"`` or
            ``[[low, high], ...]``): a learned level embedding is added to every token embedding (LaBERT §3.1, Eq. 2)
            and ``encode``/``decode_full`` take ``length_level``.
        d_head: per-head width ``d_k``; None = ``d_model // heads``. Structured pruning (``edgecap prune``) removes
            whole heads and keeps ``d_k``, so a pruned model has ``heads · d_head < d_model``.
        enc_d_ff, dec_d_ff: FFN width per unique encoder / decoder layer; None = ``d_ff`` everywhere. Pruning
            leaves a different number of FFN channels in each unique layer.
    """

    family: str = "ort"
    d_model: int = 512
    d_ff: int = 2048
    heads: int = 8
    enc_layer_map: tuple[int, ...] = field(default_factory=_default_map)
    dec_layer_map: tuple[int, ...] = field(default_factory=_default_map)
    share_att: str | None = None
    vocab_kind: str = "word"
    radix_base: int = 768
    feature_dim: int = 1280
    geometry: bool = True
    geometry_dim: int = 64
    box_wh_offset: float = 0.0
    dropout: float = 0.1
    feature_dropout: float = 0.5
    max_len: int = 31
    layer_norm: str = "standard"
    length_levels: Any = None
    d_head: int | None = None
    enc_d_ff: tuple[int, ...] | None = None
    dec_d_ff: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "length_levels", optional_length_levels(self.length_levels, "ObjectRelationCfg"))
        for name in ("enc_layer_map", "dec_layer_map"):
            try:
                object.__setattr__(self, name, parse_layer_map(getattr(self, name)))
            except LayerMapError as exc:
                raise ModelCfgError(f"ObjectRelationCfg.{name}: {exc}") from exc
        if isinstance(self.share_att, str) and self.share_att.lower() in ("none", "null", ""):
            object.__setattr__(self, "share_att", None)  # CLI overrides spell "no sharing" as text
        check_positive_ints(self, ("d_model", "d_ff", "heads", "feature_dim", "max_len", "radix_base", "geometry_dim"))
        if self.d_head is not None:
            check_positive_ints(self, ("d_head",))
        for name, layer_map in (("enc_d_ff", self.enc_layer_map), ("dec_d_ff", self.dec_layer_map)):
            object.__setattr__(self, name, _widths(name, getattr(self, name), max(layer_map) + 1))
        if self.d_head is None and self.d_model % self.heads:
            raise ModelCfgError(f"ObjectRelationCfg.d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        if self.d_model % 2:
            raise ModelCfgError(f"ObjectRelationCfg.d_model ({self.d_model}) must be even (sinusoidal positions)")
        if self.geometry_dim % 8:
            raise ModelCfgError(f"ObjectRelationCfg.geometry_dim ({self.geometry_dim}) must be a multiple of 8")
        if self.radix_base < 2:
            raise ModelCfgError(f"ObjectRelationCfg.radix_base must be >= 2, got {self.radix_base}")
        if self.share_att not in SHARE_KINDS:
            raise ModelCfgError(f"ObjectRelationCfg.share_att must be one of {SHARE_KINDS}, got {self.share_att!r}")
        if self.vocab_kind not in VOCAB_KINDS:
            raise ModelCfgError(f"ObjectRelationCfg.vocab_kind must be one of {VOCAB_KINDS}, got {self.vocab_kind!r}")
        if self.layer_norm not in NORM_KINDS:
            raise ModelCfgError(f"ObjectRelationCfg.layer_norm must be one of {NORM_KINDS}, got {self.layer_norm!r}")
        if not isinstance(self.geometry, bool):
            raise ModelCfgError(f"ObjectRelationCfg.geometry must be true or false, got {self.geometry!r}")
        check_fractions(self, ("dropout", "feature_dropout"))
        if not isinstance(self.box_wh_offset, (int, float)) or self.box_wh_offset < 0:
            raise ModelCfgError(f"ObjectRelationCfg.box_wh_offset must be >= 0, got {self.box_wh_offset!r}")

    # -- derived -------------------------------------------------------------------------------------------------
    @property
    def enc_layers(self) -> int:
        return len(self.enc_layer_map)

    @property
    def dec_layers(self) -> int:
        return len(self.dec_layer_map)

    @property
    def head_dim(self) -> int:
        """``d_k``: :attr:`d_head`, or ``d_model // heads`` when it is None."""
        return self.d_model // self.heads if self.d_head is None else self.d_head

    @property
    def enc_widths(self) -> tuple[int, ...]:
        """FFN width of each unique encoder layer."""
        return self.enc_d_ff or (self.d_ff,) * (max(self.enc_layer_map) + 1)

    @property
    def dec_widths(self) -> tuple[int, ...]:
        """FFN width of each unique decoder layer."""
        return self.dec_d_ff or (self.d_ff,) * (max(self.dec_layer_map) + 1)

    def summary(self) -> dict[str, Any]:
        """Architecture columns for ``edgecap zoo``."""
        return {
            "family": self.family,
            "d_model": self.d_model,
            "d_ff": self.d_ff,
            "heads": self.heads,
            "enc_layers": self.enc_layers,
            "enc_unique": max(self.enc_layer_map) + 1,
            "enc_layer_map": format_layer_map(self.enc_layer_map),
            "dec_layers": self.dec_layers,
            "dec_unique": max(self.dec_layer_map) + 1,
            "dec_layer_map": format_layer_map(self.dec_layer_map),
            "share_att": self.share_att,
            "vocab_kind": self.vocab_kind,
            "radix_base": self.radix_base if self.vocab_kind == "radix" else None,
            "geometry": self.geometry,
            "length_levels": len(self.length_levels) if self.length_levels else None,
        }


def _widths(name: str, value: Any, unique: int) -> tuple[int, ...] | None:
    """A per-unique-layer FFN width list, validated (None stays None: ``d_ff`` everywhere)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise ModelCfgError(f"ObjectRelationCfg.{name} must be a list of {unique} widths, got {value!r}")
    widths = tuple(value)
    if len(widths) != unique or any(not isinstance(w, int) or isinstance(w, bool) or w < 1 for w in widths):
        raise ModelCfgError(f"ObjectRelationCfg.{name} must be {unique} positive integers (one per unique layer)")
    return widths


#: The name this config had before each family's config was named after its family; kept for existing imports.
ModelCfg = ObjectRelationCfg
