"""Word tables of the caption grammar: synonyms, openers, position, relation and background phrases.

Each entry lists interchangeable phrasings of one fact; the grammar picks one at random. Keys are the scene's
attribute values (see :mod:`._attributes`), so a phrase can only be chosen for the fact it describes.
"""

from __future__ import annotations

Words = list[str]


SIZE_WORDS: dict[str, tuple[Words, ...]] = {
    "small": (["small"], ["little"]),
    "medium": (["medium", "sized"], ["medium"]),
    "large": (["large"], ["big"]),
}
GENERIC = (("shape", "shapes"), ("object", "objects"))
OPENERS: tuple[Words, ...] = (
    ["a", "picture", "of"],
    ["an", "image", "of"],
    ["an", "image", "showing"],
    ["a", "picture", "showing"],
    ["a", "drawing", "of"],
    ["a", "simple", "drawing", "of"],
    ["an", "illustration", "of"],
    ["this", "image", "shows"],
    ["the", "picture", "shows"],
    ["in", "this", "image", "we", "can", "see"],
    ["we", "can", "see"],
)
IN_IMAGE: tuple[Words, ...] = (["in", "the", "image"], ["in", "the", "picture"], ["in", "this", "image"])
OF_IMAGE: tuple[Words, ...] = (["of", "the", "image"], ["of", "the", "picture"])
POSITIONS: dict[tuple[str, str], tuple[Words, ...]] = {
    ("top", "left"): (["in", "the", "top", "left", "corner"], ["in", "the", "upper", "left", "corner"]),
    ("top", "center"): (["at", "the", "top"], ["near", "the", "top"]),
    ("top", "right"): (["in", "the", "top", "right", "corner"], ["in", "the", "upper", "right", "corner"]),
    ("middle", "left"): (["on", "the", "left"], ["on", "the", "left", "side"]),
    ("middle", "center"): (["in", "the", "center"], ["in", "the", "middle"]),
    ("middle", "right"): (["on", "the", "right"], ["on", "the", "right", "side"]),
    ("bottom", "left"): (["in", "the", "bottom", "left", "corner"], ["in", "the", "lower", "left", "corner"]),
    ("bottom", "center"): (["at", "the", "bottom"], ["near", "the", "bottom"]),
    ("bottom", "right"): (["in", "the", "bottom", "right", "corner"], ["in", "the", "lower", "right", "corner"]),
}
RELATIONS: dict[str, tuple[Words, ...]] = {
    "left": (["to", "the", "left", "of"], ["left", "of"]),
    "right": (["to", "the", "right", "of"], ["right", "of"]),
    "above": (["above"],),
    "below": (["below"], ["under"], ["beneath"]),
}
NEXT_TO: tuple[Words, ...] = (["next", "to"], ["beside"])
# Background texture: adjectives ("on a striped background") and noun phrases ("on a background of stripes").
BG_ADJECTIVES: dict[str, tuple[Words, ...]] = {
    "gradient": (["gradient"], ["shaded"], ["smoothly", "shaded"]),
    "stripes": (["striped"],),
    "checkerboard": (["checkered"], ["checkerboard"]),
    "noise": (["noisy"], ["grainy"]),
    "blobs": (["blotchy"], ["mottled"], ["cloudy"]),
    "grid": (["grid"],),
}
BG_NOUNS: dict[str, tuple[Words, ...]] = {
    "gradient": (["a", "smooth", "gradient"], ["a", "color", "gradient"]),
    "stripes": (["stripes"],),  # the orientation is added in _bg_noun
    "checkerboard": (["a", "checkerboard", "pattern"], ["a", "checkerboard"]),
    "noise": (["random", "noise"], ["grainy", "noise"]),
    "blobs": (["soft", "blobs"], ["blurry", "blobs"], ["soft", "patches"]),
    "grid": (["a", "grid", "of", "thin", "lines"], ["grid", "lines"]),
}
