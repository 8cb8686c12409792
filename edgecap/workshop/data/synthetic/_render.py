"""Rasterise a :class:`Scene`: a vectorised numpy texture, anti-aliased PIL shapes, then sensor-like noise.

No per-pixel Python loops: backgrounds are whole-array expressions, shapes are polygons drawn 4x supersampled in a
small patch and box-filtered down (anti-aliased edges), and one noise field covers the finished image so objects
are not perfectly flat either. All randomness comes from the ``rng`` argument.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from PIL import Image, ImageDraw

from edgecap.workshop.data.synthetic._attributes import COLOUR_JITTER, COLOURS
from edgecap.workshop.data.synthetic._scene import Background, Scene, SceneObject

__all__ = ["render_background", "render_scene"]

_SUPERSAMPLE = 4
# Standard deviation (grey levels) of the noise added to every finished image; the "noise" texture adds more.
_SENSOR_NOISE = 3.0


@functools.lru_cache(maxsize=4)
def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    yy.setflags(write=False)
    xx.setflags(write=False)
    return yy, xx


def _muted(rng: np.random.Generator) -> np.ndarray:
    """A desaturated mid-tone: far from every object colour, including white and black."""
    grey = rng.uniform(85.0, 170.0)
    return (grey + rng.uniform(-20.0, 20.0, size=3)).astype(np.float32)


def _partner(rng: np.random.Generator, base: np.ndarray, low: float, high: float) -> np.ndarray:
    """A second muted tone, lighter or darker than ``base`` by ``low..high`` grey levels, still mid-range."""
    shift = rng.uniform(low, high) * (1.0 if base.mean() < 127.5 else -1.0)
    return np.clip(base + shift + rng.uniform(-10.0, 10.0, size=3), 55.0, 200.0).astype(np.float32)


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    return a + (b - a) * t[..., None]


def _stripe_axis(rng: np.random.Generator, orientation: str | None, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
    """Coordinate across the stripes: vertical stripes vary along x, horizontal ones along y."""
    jitter = math.radians(rng.uniform(-4.0, 4.0))
    if orientation == "vertical":
        theta = jitter
    elif orientation == "horizontal":
        theta = math.pi / 2 + jitter
    else:
        theta = (math.pi / 4 if rng.random() < 0.5 else 3 * math.pi / 4) + jitter
    return xx * math.cos(theta) + yy * math.sin(theta)


def render_background(background: Background, size: int, rng: np.random.Generator) -> np.ndarray:
    """The texture alone as a float32 ``(size, size, 3)`` array in [0, 255]."""
    yy, xx = _grid(size)
    scale = size / 256.0
    base = _muted(rng)
    kind = background.kind
    if kind == "gradient":
        theta = rng.uniform(0.0, 2 * math.pi)
        t = xx * math.cos(theta) + yy * math.sin(theta)
        t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
        img = _lerp(base, _partner(rng, base, 40.0, 80.0), t)
    elif kind == "stripes":
        u = _stripe_axis(rng, background.orientation, xx, yy)
        period = rng.uniform(10.0, 28.0) * scale
        wave = np.sin(u * (2 * math.pi / period) + rng.uniform(0.0, 2 * math.pi))
        img = _lerp(base, _partner(rng, base, 30.0, 55.0), np.clip(wave * 3.0 + 0.5, 0.0, 1.0))
    elif kind == "checkerboard":
        cell = rng.uniform(14.0, 40.0) * scale
        phase = rng.uniform(0.0, cell, size=2)
        parity = (np.floor((xx + phase[0]) / cell) + np.floor((yy + phase[1]) / cell)) % 2
        img = _lerp(base, _partner(rng, base, 25.0, 45.0), parity.astype(np.float32))
    elif kind == "noise":
        # Mostly luminance noise: strong chroma noise would look like specks of object colours.
        side = max(size // 16, 2)
        coarse = rng.normal(0.0, 20.0, size=(side, side, 1)) + rng.normal(0.0, 6.0, size=(side, side, 3))
        coarse_img = Image.fromarray(np.clip(coarse + 128.0, 0, 255).astype(np.uint8), "RGB")
        smooth = np.asarray(coarse_img.resize((size, size), Image.Resampling.BILINEAR), dtype=np.float32) - 128.0
        grain = rng.standard_normal(size=(size, size, 1), dtype=np.float32) * np.float32(14.0)
        img = base + smooth + grain
    elif kind == "blobs":
        img = np.broadcast_to(base, (size, size, 3)).copy()
        for _ in range(int(rng.integers(5, 10))):
            cx, cy = rng.uniform(0.0, size, size=2)
            sigma = rng.uniform(size / 14.0, size / 5.0)
            gx = np.exp(-((xx[0] - cx) ** 2) / (2 * sigma**2))
            gy = np.exp(-((yy[:, 0] - cy) ** 2) / (2 * sigma**2))
            tone = rng.uniform(-40.0, 40.0) + rng.uniform(-12.0, 12.0, size=3)  # lighter/darker, barely tinted
            img += np.outer(gy, gx)[..., None] * tone.astype(np.float32)
    elif kind == "grid":
        period = rng.uniform(16.0, 36.0) * scale
        width = max(1.5 * scale, 1.0)
        phase = rng.uniform(0.0, period, size=2)
        on_line = (np.mod(xx + phase[0], period) < width) | (np.mod(yy + phase[1], period) < width)
        img = _lerp(base, _partner(rng, base, 35.0, 60.0), on_line.astype(np.float32))
    else:  # pragma: no cover - Background validates kind
        raise ValueError(f"unknown background kind {kind!r}")
    return np.clip(img, 0.0, 255.0)


def _unit_outline(shape: str) -> list[tuple[float, float]]:
    """Polygon of ``shape`` with extent ~1 around the origin (y down, pointing up)."""
    if shape == "square":
        return [(-0.8, -0.8), (0.8, -0.8), (0.8, 0.8), (-0.8, 0.8)]
    if shape == "diamond":
        return [(0.0, -1.0), (0.7, 0.0), (0.0, 1.0), (-0.7, 0.0)]
    if shape == "triangle":
        return [(0.0, -0.85), (0.95, 0.8), (-0.95, 0.8)]
    if shape == "star":
        points = []
        for k in range(10):
            radius = 1.0 if k % 2 == 0 else 0.45
            angle = -math.pi / 2 + k * math.pi / 5
            points.append((radius * math.cos(angle), radius * math.sin(angle) + 0.095))
        return points
    if shape == "cross":
        w = 0.3  # arm half-width
        top, right = [(-w, -1.0), (w, -1.0), (w, -w)], [(1.0, -w), (1.0, w), (w, w)]
        bottom, left = [(w, 1.0), (-w, 1.0), (-w, w)], [(-1.0, w), (-1.0, -w), (-w, -w)]
        return top + right + bottom + left
    if shape == "semicircle":
        arc = [(math.cos(a), math.sin(a) + 0.5) for a in np.linspace(math.pi, 2 * math.pi, 33)]
        return arc
    raise ValueError(f"shape {shape!r} has no polygon outline")


def _object_mask(obj: SceneObject) -> tuple[Image.Image, int]:
    """Anti-aliased coverage mask of ``obj`` in a square patch of half-width ``h`` centred on the object."""
    h = int(math.ceil(obj.radius * 1.2)) + 2
    ss = _SUPERSAMPLE
    big = Image.new("L", (2 * h * ss, 2 * h * ss), 0)
    draw = ImageDraw.Draw(big)
    centre, r = h * ss, obj.radius * ss
    if obj.shape in ("circle", "ring"):
        draw.ellipse((centre - r, centre - r, centre + r, centre + r), fill=255)
        if obj.shape == "ring":
            inner = 0.55 * r
            draw.ellipse((centre - inner, centre - inner, centre + inner, centre + inner), fill=0)
    else:
        theta = math.radians(obj.angle)
        cos, sin = math.cos(theta), math.sin(theta)
        points = [
            (centre + r * (u * cos + v * sin), centre + r * (-u * sin + v * cos)) for u, v in _unit_outline(obj.shape)
        ]
        draw.polygon(points, fill=255)
    return big.resize((2 * h, 2 * h), Image.Resampling.BOX), h


def render_scene(scene: Scene, size: int | None = None, rng: np.random.Generator | None = None) -> Image.Image:
    """Draw ``scene`` as an RGB image.

    Args:
        scene: what to draw; its pixel coordinates refer to a ``scene.size`` square.
        size: output side; must equal ``scene.size`` (kept explicit so callers state the resolution they expect).
        rng: randomness for texture parameters, colour jitter and noise (``None``: a generator seeded with 0).

    Returns:
        A ``size x size`` RGB ``PIL.Image``.
    """
    size = scene.size if size is None else size
    if size != scene.size:
        raise ValueError(f"render size {size} differs from the scene's size {scene.size}; sample the scene at {size}")
    rng = np.random.default_rng(0) if rng is None else rng
    image = Image.fromarray(render_background(scene.background, size, rng).astype(np.uint8), "RGB")
    for obj in scene.objects:
        mask, h = _object_mask(obj)
        # A shared brightness shift plus a small per-channel one: white stays white instead of turning pastel.
        jitter = rng.integers(-COLOUR_JITTER, COLOUR_JITTER + 1) + rng.integers(-4, 5, size=3)
        colour = tuple(int(c) for c in np.clip(np.asarray(COLOURS[obj.colour]) + jitter, 0, 255))
        image.paste(colour, (obj.x - h, obj.y - h, obj.x + h, obj.y + h), mask)
    noise = rng.standard_normal(size=(size, size, 1), dtype=np.float32) * np.float32(_SENSOR_NOISE)
    pixels = np.asarray(image, dtype=np.float32) + noise
    return Image.fromarray(np.clip(np.rint(pixels, out=pixels), 0, 255, out=pixels).astype(np.uint8), "RGB")
