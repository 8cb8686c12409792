"""Scene description (what is in an image) and the random sampler that produces it.

A :class:`Scene` is the ground truth both the renderer and the caption grammar read: objects with a shape, a
colour, a size class and a pixel position, on a background of a named texture. Positions are in pixels of a
square image of side ``size``; every object lies inside the central ``CROP_FRACTION`` of the image, the region
the backbone keeps after its resize-256 / centre-crop-224 preprocessing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edgecap.workshop.data.synthetic._attributes import (
    BACKGROUNDS,
    COLOURS,
    CROP_FRACTION,
    MAX_OBJECTS,
    SHAPES,
    SIZES,
    STRIPE_ORIENTATIONS,
)

__all__ = ["Background", "Scene", "SceneObject", "crop_box", "sample_scene"]

Pair = tuple[str, str]  # (colour, shape)

# Largest rotation (degrees) per shape: small enough that a square never reads as a diamond, a cross as an "x",
# a triangle or semicircle as pointing sideways. Rotation-invariant shapes get none.
_MAX_ANGLE: dict[str, int] = {
    "circle": 0,
    "ring": 0,
    "square": 12,
    "diamond": 8,
    "triangle": 12,
    "star": 10,
    "cross": 10,
    "semicircle": 10,
}
# Probability of 1, 2, 3, 4 objects.
_NUM_OBJECTS_P = (0.15, 0.30, 0.30, 0.25)
# Minimum free space between two objects, as a fraction of the image side.
_MIN_GAP = 0.03
# Objects are centred inside the central 60% of one cell of the 3 x 3 grid over the crop, so that the grammar's
# "in the top left corner" / "in the center" words are never borderline (see _geometry.position_region).
_CELL_CORE = 0.6


class SceneError(ValueError):
    """A scene or scene object has an unknown attribute or impossible geometry."""


@dataclass(frozen=True)
class SceneObject:
    """One drawn object.

    Attributes:
        shape, colour, size: names from ``SHAPES``, ``COLOURS``, ``SIZES``.
        x, y: centre in pixels (x to the right, y downwards).
        radius: half of the object's extent in pixels.
        angle: rotation in degrees (counter-clockwise), small enough not to change the shape's name.
    """

    shape: str
    colour: str
    size: str
    x: int
    y: int
    radius: int
    angle: int = 0

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise SceneError(f"unknown shape {self.shape!r}; expected one of {sorted(SHAPES)}")
        if self.colour not in COLOURS:
            raise SceneError(f"unknown colour {self.colour!r}; expected one of {sorted(COLOURS)}")
        if self.size not in SIZES:
            raise SceneError(f"unknown size {self.size!r}; expected one of {sorted(SIZES)}")
        if self.radius <= 0:
            raise SceneError(f"object radius must be positive, got {self.radius}")

    @property
    def pair(self) -> Pair:
        return (self.colour, self.shape)


@dataclass(frozen=True)
class Background:
    """Background texture: ``kind`` from ``BACKGROUNDS``; ``orientation`` only for stripes."""

    kind: str
    orientation: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in BACKGROUNDS:
            raise SceneError(f"unknown background {self.kind!r}; expected one of {list(BACKGROUNDS)}")
        if (self.kind == "stripes") != (self.orientation is not None):
            raise SceneError(f"background {self.kind!r}: orientation {self.orientation!r} is only for stripes")
        if self.orientation is not None and self.orientation not in STRIPE_ORIENTATIONS:
            raise SceneError(f"unknown stripe orientation {self.orientation!r}")


@dataclass(frozen=True)
class Scene:
    """A square image of side ``size`` pixels: a background and 1..MAX_OBJECTS objects."""

    size: int
    background: Background
    objects: tuple[SceneObject, ...]

    def __post_init__(self) -> None:
        if self.size < 224:
            raise SceneError(f"image size must be at least 224 pixels, got {self.size}")
        if not 1 <= len(self.objects) <= MAX_OBJECTS:
            raise SceneError(f"a scene holds 1..{MAX_OBJECTS} objects, got {len(self.objects)}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, stored per image in ``dataset.json`` as ground truth for grounding checks."""
        return {
            "background": asdict(self.background),
            "objects": [asdict(o) for o in self.objects],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], size: int) -> Scene:
        """Inverse of :meth:`to_dict` (the image side comes from the dataset entry's ``width``)."""
        try:
            background = Background(**data["background"])
            objects = tuple(SceneObject(**o) for o in data["objects"])
        except (KeyError, TypeError) as err:
            raise SceneError(f"malformed scene record: {err}") from None
        return cls(size=size, background=background, objects=objects)


def crop_box(size: int) -> tuple[float, float]:
    """``(low, high)`` pixel bounds (both axes) of the centre crop the backbone keeps."""
    margin = size * (1.0 - CROP_FRACTION) / 2.0
    return margin, size - margin


def _choice(rng: np.random.Generator, items: list[str] | tuple[str, ...]) -> str:
    return items[int(rng.integers(len(items)))]


def _sample_pairs(rng: np.random.Generator, n: int, exclude: Collection[Pair], require: Collection[Pair]) -> list[Pair]:
    """Colour/shape pairs with deliberate repeats, so that counts ("two red circles") occur often."""
    shapes, colours = list(SHAPES), list(COLOURS)
    pairs: list[Pair] = []
    for _ in range(n):
        for _attempt in range(100):
            u = rng.random()
            if pairs and u < 0.25:
                pair = pairs[int(rng.integers(len(pairs)))]
            elif pairs and u < 0.40:
                pair = (_choice(rng, colours), pairs[int(rng.integers(len(pairs)))][1])
            elif pairs and u < 0.55:
                pair = (pairs[int(rng.integers(len(pairs)))][0], _choice(rng, shapes))
            else:
                pair = (_choice(rng, colours), _choice(rng, shapes))
            if pair not in exclude:
                break
        else:  # pragma: no cover - needs nearly every pair excluded
            raise SceneError("could not sample a colour/shape pair outside the excluded set")
        pairs.append(pair)
    if require and not any(p in require for p in pairs):
        required = sorted(require)
        pairs[int(rng.integers(n))] = required[int(rng.integers(len(required)))]
    return pairs


def _place(rng: np.random.Generator, radii: list[int], size: int) -> list[tuple[int, int]] | None:
    """Centres for objects of the given radii: inside grid-cell cores, inside the crop, not overlapping."""
    low, high = crop_box(size)
    cell = (high - low) / 3.0
    inset = cell * (1.0 - _CELL_CORE) / 2.0
    min_gap = _MIN_GAP * size
    order = sorted(range(len(radii)), key=lambda i: -radii[i])  # big objects first: they are hardest to fit
    centres: dict[int, tuple[int, int]] = {}
    for i in order:
        r = radii[i]
        for _attempt in range(60):
            col, row = int(rng.integers(3)), int(rng.integers(3))
            x_lo = max(low + col * cell + inset, low + r + 2)
            x_hi = min(low + (col + 1) * cell - inset, high - r - 2)
            y_lo = max(low + row * cell + inset, low + r + 2)
            y_hi = min(low + (row + 1) * cell - inset, high - r - 2)
            if x_lo > x_hi or y_lo > y_hi:
                continue
            x = int(rng.integers(int(np.ceil(x_lo)), int(np.floor(x_hi)) + 1))
            y = int(rng.integers(int(np.ceil(y_lo)), int(np.floor(y_hi)) + 1))
            if all(np.hypot(x - cx, y - cy) >= r + radii[j] + min_gap for j, (cx, cy) in centres.items()):
                centres[i] = (x, y)
                break
        else:
            return None
    return [centres[i] for i in range(len(radii))]


def sample_scene(
    rng: np.random.Generator,
    size: int = 256,
    *,
    num_objects: int | None = None,
    exclude_pairs: Collection[Pair] = (),
    require_pairs: Collection[Pair] = (),
) -> Scene:
    """Draw a random scene.

    Args:
        rng: the only source of randomness (same generator state -> same scene).
        size: image side in pixels (>= 224).
        num_objects: 1..MAX_OBJECTS; random (15/30/30/25 %) when ``None``.
        exclude_pairs: ``(colour, shape)`` pairs that must not appear (compositional training split).
        require_pairs: at least one object must have one of these pairs (compositional val/test split).

    Returns:
        A :class:`Scene` whose objects are non-overlapping and inside the backbone's centre crop.

    Raises:
        SceneError: bad ``size`` / ``num_objects``, or a pair both required and excluded.
    """
    if size < 224:
        raise SceneError(f"image size must be at least 224 pixels, got {size}")
    if num_objects is not None and not 1 <= num_objects <= MAX_OBJECTS:
        raise SceneError(f"num_objects must be in 1..{MAX_OBJECTS}, got {num_objects}")
    exclude, require = set(exclude_pairs), set(require_pairs)
    if exclude & require:
        raise SceneError(f"pairs both required and excluded: {sorted(exclude & require)}")
    n = num_objects if num_objects is not None else int(rng.choice(MAX_OBJECTS, p=_NUM_OBJECTS_P)) + 1
    pairs = _sample_pairs(rng, n, exclude, require)

    size_names = list(SIZES)
    for _attempt in range(200):
        sizes = [_choice(rng, size_names) for _ in range(n)]
        radii = [int(round(rng.uniform(*SIZES[s]) * size)) for s in sizes]
        centres = _place(rng, radii, size)
        if centres is not None:
            break
    else:  # pragma: no cover - four large objects always fit in a 3 x 3 grid after a few tries
        raise SceneError(f"could not place {n} objects in a {size}px image")

    objects = []
    for (colour, shape), size_name, radius, (x, y) in zip(pairs, sizes, radii, centres, strict=True):
        limit = _MAX_ANGLE[shape]
        angle = int(rng.integers(-limit, limit + 1)) if limit else 0
        objects.append(SceneObject(shape, colour, size_name, x, y, radius, angle))

    kind = _choice(rng, BACKGROUNDS)
    orientation = _choice(rng, STRIPE_ORIENTATIONS) if kind == "stripes" else None
    return Scene(size=size, background=Background(kind, orientation), objects=tuple(objects))
