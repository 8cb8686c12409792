"""Which official family a state dict looks like, so that ``--from`` with another family's checkpoint is refused by
name rather than failing on a missing tensor or, for ORT and ACORT, which share one layout, importing silently as
the wrong function.

ORT and ACORT differ in what the layout allows: ORT (yahoo/object_relation_transformer) never shares attention
projections or layers, and its output classes are its words + 1; ACORT's are a radix base + 3, and the base is
smaller than the vocabulary (768 for ~10k COCO words), so each word takes two or more digits.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from edgecap.workshop.interop._reading import CheckpointError

__all__ = ["LAYOUTS", "check_layout", "layout_of", "looks_like_acort"]

#: Layout -> (tensors that mark it, the ``--from`` values that read it).
LAYOUTS: dict[str, tuple[tuple[str, ...], str]] = {
    "relation-transformer": (("att_embed.0.weight", "model.generator.proj.weight"), "--from ort or --from acort"),
    "expansionnet-v2": (("input_linear.weight", "vocab_linear.weight"), "--from expansionnet-v2"),
}


def layout_of(names: Iterable[str]) -> str | None:
    """The layout whose marker tensors are all present, else None."""
    present = set(names)
    return next((layout for layout, (markers, _) in LAYOUTS.items() if set(markers) <= present), None)


def check_layout(names: Iterable[str], wanted: str, source: str, family: str) -> None:
    """Refuse a checkpoint with another family's layout, naming the family it looks like and the ``--from`` for it.

    A state dict that matches no known layout is left to the importer, whose missing-tensor errors name what lacks.
    """
    found = layout_of(names)
    if found is None or found == wanted:
        return
    markers, option = LAYOUTS[found]
    raise CheckpointError(
        f"{source} does not hold {family} weights: its tensors ({', '.join(repr(m) for m in markers)}) are the "
        f"{found} layout; pass {option}"
    )


def looks_like_acort(arch: dict[str, Any]) -> str:
    """Why a relation-transformer state dict cannot be ORT's (shared projections or layers), or ""."""
    reasons = []
    if arch["share_att"] is not None:
        reasons.append("3 projections per attention (ACORT's attention sharing)")
    for part in ("enc_layer_map", "dec_layer_map"):
        layer_map = tuple(arch[part])
        if layer_map != tuple(range(len(layer_map))):
            reasons.append(f"shared layers {list(layer_map)} ({part.split('_')[0]}oder)")
    return "; ".join(reasons)
