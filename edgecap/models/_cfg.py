"""``ModelCfg``: the architecture of an ORT/ACORT captioner as one frozen, JSON-round-trippable dataclass."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgecap.length import LengthLevelError, Levels, parse_levels
from edgecap.models.layers.attention import SHARE_KINDS
from edgecap.models.layers.layer_map import LayerMapError, format_layer_map, parse_layer_map
from edgecap.models.layers.norm import NORM_KINDS

__all__ = ["ModelCfg", "ModelCfgError", "PAPER_FEATURE_DIM", "PAPER_WORD_VOCAB_SIZE", "VOCAB_KINDS"]

VOCAB_KINDS = ("word", "radix")
#: Bottom-up Faster R-CNN region features used by ORT/ACORT (ACORT §3).
PAPER_FEATURE_DIM = 2048
#: The reference's SentencePiece word vocabulary for COCO (pad/unk/bos/eos + 9,997 words).
PAPER_WORD_VOCAB_SIZE = 10001


def cfg_from_mapping(cls: type[Any], data: Any, source: str) -> Any:
    """``cls(**data)`` for a family's config dataclass, with errors that name ``source`` (a run's ``config.json``, a
    bundle manifest): not a mapping, unknown fields, invalid values. Every family's ``from_dict`` uses it."""
    if not isinstance(data, Mapping):
        raise ModelCfgError(f"{source}: expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ModelCfgError(f"{source}: unknown model config field(s) {unknown}")
    try:
        return cls(**dict(data))
    except ModelCfgError as exc:
        raise ModelCfgError(f"{source}: {exc}") from exc


def replace_cfg(cfg: Any, changes: Mapping[str, Any]) -> Any:
    """``dataclasses.replace`` for a family's config dataclass; unknown field names raise :class:`ModelCfgError`
    listing the known ones. Every family's ``replace`` uses it."""
    names = [f.name for f in dataclasses.fields(cfg)]
    unknown = sorted(set(changes) - set(names))
    if unknown:
        raise ModelCfgError(f"unknown {type(cfg).__name__} field(s) {unknown}; known: {names}")
    return dataclasses.replace(cfg, **changes)


class ModelCfgError(ValueError):
    """A model configuration field with an invalid value or an unknown name."""


def check_positive_ints(cfg: Any, names: tuple[str, ...]) -> None:
    """Raise :class:`ModelCfgError` unless every field in ``names`` is an int >= 1 (bools refused)."""
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ModelCfgError(f"{type(cfg).__name__}.{name} must be a positive integer, got {value!r}")


def check_fractions(cfg: Any, names: tuple[str, ...]) -> None:
    """Raise :class:`ModelCfgError` unless every field in ``names`` is a number in [0, 1) (dropout rates)."""
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
            raise ModelCfgError(f"{type(cfg).__name__}.{name} must be in [0, 1), got {value!r}")


def radix_output_classes(cfg: Any, vocab_size: int) -> int:
    """``output_classes`` of a config with ``vocab_kind``/``radix_base``: validate ``vocab_size`` and return it
    (a radix model needs ``radix_base + 3`` classes)."""
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 2:
        raise ModelCfgError(f"vocab_size must be an integer >= 2, got {vocab_size!r}")
    if cfg.vocab_kind == "radix" and vocab_size != cfg.radix_base + 3:
        raise ModelCfgError(
            f"a radix model with radix_base={cfg.radix_base} has {cfg.radix_base + 3} classes "
            f"(PAD, {cfg.radix_base} digits, BOS, EOS) but vocab_size={vocab_size}; build the vocabulary with "
            f"radix_base={cfg.radix_base} or pass radix_base={vocab_size - 3}"
        )
    return vocab_size


def optional_length_levels(value: Any, owner: str) -> Levels | None:
    """A config's ``length_levels`` field, normalised: None (also the CLI spellings ``"none"``/``"null"``/``""``) ->
    None, a plan name or ``[[low, high], ...]`` -> validated pairs (:func:`~edgecap.length.parse_levels`).
    Every autoregressive family's config uses it, so ``--set length_levels=4level`` means the same everywhere.

    Raises:
        ModelCfgError: a malformed plan, naming ``owner`` (the config class).
    """
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
        return None
    try:
        return parse_levels(value)
    except LengthLevelError as exc:
        raise ModelCfgError(f"{owner}.length_levels: {exc}") from exc


def _default_map() -> tuple[int, ...]:
    return (0, 1, 2, 3, 4, 5)


@dataclass(frozen=True)
class ModelCfg:
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "length_levels", optional_length_levels(self.length_levels, "ModelCfg"))
        for name in ("enc_layer_map", "dec_layer_map"):
            try:
                object.__setattr__(self, name, parse_layer_map(getattr(self, name)))
            except LayerMapError as exc:
                raise ModelCfgError(f"ModelCfg.{name}: {exc}") from exc
        if isinstance(self.share_att, str) and self.share_att.lower() in ("none", "null", ""):
            object.__setattr__(self, "share_att", None)  # CLI overrides spell "no sharing" as text
        check_positive_ints(self, ("d_model", "d_ff", "heads", "feature_dim", "max_len", "radix_base", "geometry_dim"))
        if self.d_model % self.heads:
            raise ModelCfgError(f"ModelCfg.d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        if self.d_model % 2:
            raise ModelCfgError(f"ModelCfg.d_model ({self.d_model}) must be even (sinusoidal positions)")
        if self.geometry_dim % 8:
            raise ModelCfgError(f"ModelCfg.geometry_dim ({self.geometry_dim}) must be a multiple of 8")
        if self.radix_base < 2:
            raise ModelCfgError(f"ModelCfg.radix_base must be >= 2, got {self.radix_base}")
        if self.share_att not in SHARE_KINDS:
            raise ModelCfgError(f"ModelCfg.share_att must be one of {SHARE_KINDS}, got {self.share_att!r}")
        if self.vocab_kind not in VOCAB_KINDS:
            raise ModelCfgError(f"ModelCfg.vocab_kind must be one of {VOCAB_KINDS}, got {self.vocab_kind!r}")
        if self.layer_norm not in NORM_KINDS:
            raise ModelCfgError(f"ModelCfg.layer_norm must be one of {NORM_KINDS}, got {self.layer_norm!r}")
        if not isinstance(self.geometry, bool):
            raise ModelCfgError(f"ModelCfg.geometry must be true or false, got {self.geometry!r}")
        check_fractions(self, ("dropout", "feature_dropout"))
        if not isinstance(self.box_wh_offset, (int, float)) or self.box_wh_offset < 0:
            raise ModelCfgError(f"ModelCfg.box_wh_offset must be >= 0, got {self.box_wh_offset!r}")

    # -- derived -------------------------------------------------------------------------------------------------
    @property
    def enc_layers(self) -> int:
        return len(self.enc_layer_map)

    @property
    def dec_layers(self) -> int:
        return len(self.dec_layer_map)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def output_classes(self, vocab_size: int) -> int:
        """Validate ``vocab_size`` against this cfg and return it (radix models need ``radix_base + 3``)."""
        return radix_output_classes(self, vocab_size)

    # -- serialisation -------------------------------------------------------------------------------------------
    def replace(self, **changes: Any) -> ModelCfg:
        """A copy with ``changes``; unknown names raise :class:`ModelCfgError`."""
        return replace_cfg(self, changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (layer maps as lists); :meth:`from_dict` inverts it."""
        out = dataclasses.asdict(self)
        out["enc_layer_map"] = list(self.enc_layer_map)
        out["dec_layer_map"] = list(self.dec_layer_map)
        if self.length_levels is not None:
            out["length_levels"] = [list(p) for p in self.length_levels]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "model config") -> ModelCfg:
        """Build from :meth:`to_dict` output (or a hand-written subset; missing fields take defaults).

        Raises:
            ModelCfgError: unknown fields or invalid values, naming ``source``.
        """
        return cfg_from_mapping(cls, data, source)

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
