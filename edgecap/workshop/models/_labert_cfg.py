"""``LaBertCfg``: the architecture of a LaBERT captioner (Deng et al. 2020, "Length-Controllable Image Captioning") as
one frozen, JSON-round-trippable dataclass (the registry's ``FamilyCfg``), with the paper's per-level refinement
defaults (§4.2, §4.4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgecap.runtime.length import PAPER_EOS_DECAY, PAPER_REFINE_STEPS, LengthLevelError, parse_levels
from edgecap.workshop.models._cfg import FamilyCfg, ModelCfgError, check_positive_ints, replace_cfg

__all__ = ["LaBertCfg"]


def _plan_defaults(levels: tuple[tuple[int, int], ...]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    for plan in ("4level", "5level"):
        if levels == parse_levels(plan):
            return PAPER_REFINE_STEPS[plan], PAPER_EOS_DECAY[plan]
    return tuple(min(high, 25) for _, high in levels), tuple(1.0 for _ in levels)


@dataclass(frozen=True)
class LaBertCfg(FamilyCfg):
    """Architecture of a LaBERT captioner.

    Attributes:
        family: ``"labert"``.
        d_model, layers, heads, d_ff: BERT width, depth, heads and FFN width (paper: 768, 12, 12, 3072; §4.2).
        feature_dim: channels of the visual features (grid or regions).
        levels: length levels, a plan name (``"4level"``, ``"5level"``) or ``[[low, high], ...]`` (§3.1).
        refine_steps: default T per level for mask-predict (None: §4.4's 10/15/20/25 for 4 levels).
        eos_decay: default γ per level (None: §4.2's 1.0/0.88/0.95/1.0 for 4 levels).
        dropout: BERT's hidden and attention dropout (0.1).
        vocab_kind: always ``"word"`` (each position is one word; the length levels count words).
        radix_base: unused (kept for the registry's family-cfg interface).
    """

    family: str = "labert"
    d_model: int = 768
    layers: int = 12
    heads: int = 12
    d_ff: int = 3072
    feature_dim: int = 1280
    levels: Any = "4level"
    refine_steps: tuple[int, ...] | None = None
    eos_decay: tuple[float, ...] | None = None
    dropout: float = 0.1
    vocab_kind: str = "word"
    radix_base: int = 768

    def __post_init__(self) -> None:
        try:
            levels = parse_levels(self.levels)
        except LengthLevelError as exc:
            raise ModelCfgError(f"LaBertCfg.levels: {exc}") from exc
        object.__setattr__(self, "levels", levels)
        steps, decay = _plan_defaults(levels)
        if self.refine_steps is None:
            object.__setattr__(self, "refine_steps", steps)
        if self.eos_decay is None:
            object.__setattr__(self, "eos_decay", decay)
        object.__setattr__(self, "refine_steps", tuple(int(t) for t in self.refine_steps))
        object.__setattr__(self, "eos_decay", tuple(float(g) for g in self.eos_decay))
        check_positive_ints(self, ("d_model", "layers", "heads", "d_ff", "feature_dim"))
        if self.d_model % self.heads:
            raise ModelCfgError(f"LaBertCfg.d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        if len(self.refine_steps) != len(levels) or any(t < 1 for t in self.refine_steps):
            raise ModelCfgError(f"LaBertCfg.refine_steps needs one T >= 1 per level, got {self.refine_steps}")
        if len(self.eos_decay) != len(levels) or any(not 0.0 < g <= 1.0 for g in self.eos_decay):
            raise ModelCfgError(f"LaBertCfg.eos_decay needs one γ in (0, 1] per level, got {self.eos_decay}")
        if self.vocab_kind != "word":
            raise ModelCfgError("LaBERT predicts one word per position; vocab_kind must be 'word'")
        if not 0.0 <= self.dropout < 1.0:
            raise ModelCfgError(f"LaBertCfg.dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def max_len(self) -> int:
        """Caption positions: the last level's ``L_high``."""
        return self.levels[-1][1]

    def output_classes(self, vocab_size: int) -> int:
        if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 4:
            raise ModelCfgError(f"vocab_size must be an integer >= 4, got {vocab_size!r}")
        return vocab_size

    def replace(self, **changes: Any) -> LaBertCfg:
        if "levels" in changes and "refine_steps" not in changes:
            changes["refine_steps"] = None  # defaults follow the new plan
        if "levels" in changes and "eos_decay" not in changes:
            changes["eos_decay"] = None
        return replace_cfg(self, changes)

    def summary(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "d_model": self.d_model,
            "d_ff": self.d_ff,
            "heads": self.heads,
            "enc_layers": self.layers,
            "enc_unique": self.layers,
            "enc_layer_map": "joint visual+text",
            "dec_layers": 0,
            "dec_unique": 0,
            "dec_layer_map": "mask-predict",
            "share_att": None,
            "vocab_kind": self.vocab_kind,
            "radix_base": None,
            "geometry": False,
            "length_levels": len(self.levels),
        }
