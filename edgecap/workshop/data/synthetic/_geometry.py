"""Facts about object positions that captions may state: absolute region and pairwise spatial relations.

Every predicate has a margin, so a caption only says "to the left of" or "in the top left corner" when a person
looking at the image would agree without hesitation; borderline configurations get no statement at all.
"""

from __future__ import annotations

import math

from edgecap.workshop.data.synthetic._scene import SceneObject, crop_box

__all__ = ["RELATION_MARGIN", "NEAR_GAP", "is_next_to", "position_region", "spatial_relation", "inverse_relation"]

# A horizontal/vertical relation needs the centres apart by at least this fraction of the image side ...
RELATION_MARGIN = 0.05
# ... and the displacement along that axis at least this many times the displacement across it (within ~34 deg).
DOMINANCE = 1.5
# "next to": side by side with at most this much free space between the outlines (fraction of the image side).
NEAR_GAP = 0.10
# Region boundaries (thirds of the crop) are blurred by this fraction of the crop on each side.
REGION_DEAD_ZONE = 0.05

_ROWS = ("top", "middle", "bottom")
_COLS = ("left", "center", "right")
_INVERSE = {"left": "right", "right": "left", "above": "below", "below": "above"}


def spatial_relation(a: SceneObject, b: SceneObject, size: int) -> str | None:
    """Where ``a`` is relative to ``b``: ``"left"``, ``"right"``, ``"above"``, ``"below"``, or ``None``.

    Computed from the object centres (image y grows downwards). ``None`` when the centres are closer than the
    margin along the dominant axis, or when the displacement is too diagonal for either reading to be clear.
    """
    dx, dy = a.x - b.x, a.y - b.y
    margin = RELATION_MARGIN * size
    if abs(dx) >= margin and abs(dx) >= DOMINANCE * abs(dy):
        return "left" if dx < 0 else "right"
    if abs(dy) >= margin and abs(dy) >= DOMINANCE * abs(dx):
        return "above" if dy < 0 else "below"
    return None


def inverse_relation(relation: str) -> str:
    """``spatial_relation(b, a)`` given ``spatial_relation(a, b)``."""
    return _INVERSE[relation]


def is_next_to(a: SceneObject, b: SceneObject, size: int) -> bool:
    """Side by side (a left/right relation holds) with a small gap between the two outlines."""
    if spatial_relation(a, b, size) not in ("left", "right"):
        return False
    gap = math.hypot(a.x - b.x, a.y - b.y) - a.radius - b.radius
    return gap <= NEAR_GAP * size


def position_region(obj: SceneObject, size: int) -> tuple[str, str] | None:
    """``(row, column)`` of the 3 x 3 grid over the centre crop: rows top/middle/bottom, columns left/center/right.

    ``None`` when the centre lies within the dead zone of a grid line or outside the crop.
    """
    low, high = crop_box(size)
    span = high - low
    cells = []
    for value in (obj.y, obj.x):
        t = (value - low) / span
        if not 0.0 <= t <= 1.0 or any(abs(t - edge) < REGION_DEAD_ZONE for edge in (1 / 3, 2 / 3)):
            return None
        cells.append(min(int(t * 3), 2))
    return _ROWS[cells[0]], _COLS[cells[1]]
