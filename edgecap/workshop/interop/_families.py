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

__all__ = ["FEATURE_WIDTHS", "LAYOUTS", "check_feature_width", "check_layout", "layout_of", "looks_like_acort"]

#: Layout -> (tensors that mark it, the ``--from`` values that read it).
LAYOUTS: dict[str, tuple[tuple[str, ...], str]] = {
    "relation-transformer": (("att_embed.0.weight", "model.generator.proj.weight"), "--from ort or --from acort"),
    "expansionnet-v2": (("input_linear.weight", "vocab_linear.weight"), "--from expansionnet-v2"),
}


#: Layout -> the feature widths of the backbones its official code extracts features with, and what gives each.
FEATURE_WIDTHS: dict[str, dict[int, str]] = {
    # ORT and ACORT both train on the bottom-up attention features: 10-100 regions x 2048 (ResNet-101 Faster R-CNN).
    "relation-transformer": {2048: "bottom-up Faster R-CNN regions (ResNet-101)"},
    # ExpansionNet v2 runs Swin-L at 384 px; its features-only model takes that 12x12 grid (img_feature_dim 1536).
    "expansionnet-v2": {1536: "Swin-L's 12x12 grid (swin_large_patch4_window12_384)"},
}


def check_feature_width(width: int, layout: str, tensor: str, source: str, given: int | None) -> str:
    """Refuse an input-projection width that no backbone of the official code gives, unless ``given`` (the
    ``--feature-dim`` of features of one's own) confirms it; returns the import note that names the width.

    A width one column off (2047) is a truncated or mis-saved tensor more often than a new backbone, and importing it
    would only fail later, at the first feature bank, or caption from the wrong features.
    """
    known = FEATURE_WIDTHS[layout]
    if given is not None:
        if given != width:
            raise CheckpointError(
                f"{source}: --feature-dim {given}, but the input projection {tensor!r} takes {width}-d features"
            )
        return f"input width {width}: features of your own (--feature-dim {given})"
    if width in known:
        return f"input width {width}: {known[width]}"
    official = ", ".join(f"{w} ({what})" for w, what in known.items())
    raise CheckpointError(
        f"{source}: the input projection {tensor!r} takes {width}-d features, a width no backbone of the official code "
        f"gives (it uses {official}); if the model was trained on {width}-d features of your own, pass --feature-dim "
        f"{width}"
    )


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
