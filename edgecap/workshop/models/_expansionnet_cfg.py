"""``ExpansionNetCfg``: the architecture of an ExpansionNet v1/v2 captioner as one frozen, JSON-round-trippable
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

__all__ = ["ExpansionNetCfg", "V2_GROUPS"]

#: Block Static Expansion lengths of ExpansionNet v2 (v2 §4.2, the best row of Table 2).
V2_GROUPS = (32, 64, 128, 256, 512)


@dataclass(frozen=True)
class ExpansionNetCfg(FamilyCfg):
    """Architecture of an ExpansionNet captioner.

    Attributes:
        family: ``"expansionnet"``.
        d_model, d_ff, heads: width, FFN width, cross-attention heads (v2 §4.2: 512, 2048, 8).
        enc_layers, dec_layers: N_enc and N_dec (3 and 3).
        enc_groups: the Block Static Expansion lengths G of every encoder layer (v2: 32..512; v1: a single 64).
        dec_slots: the Dynamic Expansion coefficient N_E of every decoder layer (16 in both papers).
        layer_reduce: the official v2 code's "reduce group": concatenate every layer's output, project back to d and
            add it to the last layer's output before the final LayerNorm (encoder and decoder). Not in the paper's
            Eq. 2-3; on for ``expansionnet-v2*`` (the code behind the paper's numbers), off for v1.
        expansion_eps: ε of the normalisation Ψ (the code's 1e-9).
        vocab_kind, radix_base: ``"word"`` (the papers) or ``"radix"``.
        feature_dim: channels of the visual features (1280: EfficientNet-Lite0 grid).
        paper_feature_dim: channels at the paper's setting, for ``edgecap zoo`` only (v2: Swin-L 1536; v1: 2048
            bottom-up regions).
        dropout: residual, FFN, attention, embedding and ``M`` dropout.
        feature_dropout: dropout after the input projection (the code's ``enc_input_drop``).
        max_len: decoder positions (a learned table; the v2 code uses 74).
        length_levels: None (no length control) or a length-level plan (``"4level"``, ``"5level"`` or
            ``[[low, high], ...]``): a learned level embedding is added to every token embedding (LaBERT §3.1, Eq. 2)
            and ``encode``/``decode_full`` take ``length_level``; as ``ObjectRelationCfg.length_levels``.
    """

    family: str = "expansionnet"
    d_model: int = 512
    d_ff: int = 2048
    heads: int = 8
    enc_layers: int = 3
    dec_layers: int = 3
    enc_groups: tuple[int, ...] = V2_GROUPS
    dec_slots: int = 16
    layer_reduce: bool = True
    expansion_eps: float = 1e-9
    vocab_kind: str = "word"
    radix_base: int = 768
    feature_dim: int = 1280
    paper_feature_dim: int = 1536
    dropout: float = 0.1
    feature_dropout: float = 0.1
    max_len: int = 31
    length_levels: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "length_levels", optional_length_levels(self.length_levels, "ExpansionNetCfg"))
        groups = self.enc_groups
        if isinstance(groups, str):  # CLI overrides: "32,64,128"
            try:
                groups = tuple(int(g) for g in groups.replace(" ", "").split(",") if g)
            except ValueError as exc:
                raise ModelCfgError(f"ExpansionNetCfg.enc_groups: cannot parse {self.enc_groups!r}") from exc
        if isinstance(groups, int) and not isinstance(groups, bool):
            groups = (groups,)
        if not isinstance(groups, (list, tuple)) or not groups:
            raise ModelCfgError(f"ExpansionNetCfg.enc_groups must be a non-empty list of lengths, got {groups!r}")
        groups = tuple(groups)
        if any(not isinstance(g, int) or isinstance(g, bool) or g < 1 for g in groups):
            raise ModelCfgError(f"ExpansionNetCfg.enc_groups must hold positive integers, got {groups!r}")
        object.__setattr__(self, "enc_groups", groups)
        names = ("d_model", "d_ff", "heads", "enc_layers", "dec_layers", "dec_slots", "radix_base", "feature_dim")
        check_positive_ints(self, (*names, "paper_feature_dim", "max_len"))
        if self.d_model % self.heads:
            raise ModelCfgError(f"ExpansionNetCfg.d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        if self.vocab_kind not in VOCAB_KINDS:
            raise ModelCfgError(f"ExpansionNetCfg.vocab_kind must be one of {VOCAB_KINDS}, got {self.vocab_kind!r}")
        if not isinstance(self.layer_reduce, bool):
            raise ModelCfgError(f"ExpansionNetCfg.layer_reduce must be true or false, got {self.layer_reduce!r}")
        eps = self.expansion_eps
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0.0 < eps < 1.0:
            raise ModelCfgError(f"ExpansionNetCfg.expansion_eps must be in (0, 1), got {eps!r}")
        check_fractions(self, ("dropout", "feature_dropout"))

    def summary(self) -> dict[str, Any]:
        """Architecture columns for ``edgecap zoo`` (layer "maps" describe the expansion sizes)."""
        return {
            "family": self.family,
            "d_model": self.d_model,
            "d_ff": self.d_ff,
            "heads": self.heads,
            "enc_layers": self.enc_layers,
            "enc_layer_map": "G=" + "/".join(str(g) for g in self.enc_groups),
            "dec_layers": self.dec_layers,
            "dec_layer_map": f"N_E={self.dec_slots}",
            "share_att": None,
            "vocab_kind": self.vocab_kind,
            "radix_base": self.radix_base if self.vocab_kind == "radix" else None,
            "geometry": False,
            "length_levels": len(self.length_levels) if self.length_levels else None,
        }
