"""The closed vocabulary of the synthetic scenes: shapes, colours, sizes and background textures.

Everything a caption can say about an image is one of these values, so the grammar and the renderer agree by
construction. Colours are saturated and far apart in RGB, backgrounds are desaturated mid-tones, so an object's
colour name stays unambiguous after per-object jitter and texture.
"""

from __future__ import annotations

# Shape name -> plural used in captions.
SHAPES: dict[str, str] = {
    "circle": "circles",
    "square": "squares",
    "triangle": "triangles",
    "star": "stars",
    "diamond": "diamonds",
    "cross": "crosses",
    "ring": "rings",
    "semicircle": "semicircles",
}

# Colour name -> nominal sRGB; the renderer shifts brightness by at most COLOUR_JITTER (+-4 per channel).
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 35, 35),
    "green": (40, 165, 60),
    "blue": (35, 75, 220),
    "yellow": (240, 215, 40),
    "purple": (135, 55, 190),
    "orange": (245, 135, 25),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
COLOUR_JITTER = 10

# Size name -> object radius (half of its extent) as a fraction of the image side; at 256 px: small 12-15,
# medium 20-26, large 32-40 px. The gaps (radius ratio >= 1.25 between neighbours) keep the classes visually distinct.
SIZES: dict[str, tuple[float, float]] = {
    "small": (0.045, 0.060),
    "medium": (0.080, 0.100),
    "large": (0.125, 0.155),
}

# Background texture kinds. Stripes also carry an orientation ("vertical", "horizontal", "diagonal").
BACKGROUNDS: tuple[str, ...] = ("gradient", "stripes", "checkerboard", "noise", "blobs", "grid")
STRIPE_ORIENTATIONS: tuple[str, ...] = ("vertical", "horizontal", "diagonal")

# Fraction of the image side kept by the backbone preprocessing: resize the shorter side to 256, centre-crop 224.
CROP_FRACTION = 224 / 256

# Small cardinal numbers: scenes hold at most MAX_OBJECTS objects.
MAX_OBJECTS = 4
NUMBER_WORDS: dict[int, str] = {1: "one", 2: "two", 3: "three", 4: "four"}
