"""Cross-layer sharing maps (ACORT §4.2, Fig. 4).

A layer map lists, per layer *position*, the index of the unique (independently parameterised) layer that runs
there: ``(0, 0, 0, 1, 1, 1)`` is a 6-layer stack with 2 unique layers, written ``(0x3,1x3)`` in the paper;
``(0x2)`` is 2 positions sharing one layer; ``(0, 1, 2, 3, 4, 5)`` is no sharing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["LayerMapError", "format_layer_map", "parse_layer_map", "validate_layer_map"]

_ITEM = re.compile(r"^\s*(\d+)\s*(?:[x×*]\s*(\d+))?\s*$")


class LayerMapError(ValueError):
    """A layer map that cannot be parsed or does not describe a usable stack."""


def parse_layer_map(spec: str | Sequence[int]) -> tuple[int, ...]:
    """Parse the paper's notation into one unique-layer index per position.

    Accepts ``"(0x3,1x3)"``, ``"(0x2)"``, ``"(0,0,1,1,2,2)"``, ``"0x3, 1x3"`` (brackets optional, ``x``/``×``/``*``
    as the repeat sign) or an already expanded sequence of ints (e.g. a JSON list from a config file).

    Raises:
        LayerMapError: malformed text, a repeat count of 0, or a map that fails :func:`validate_layer_map`.
    """
    if isinstance(spec, str):
        body = spec.strip()
        if body[:1] in "([" and body[-1:] in ")]":
            body = body[1:-1]
        if not body.strip():
            raise LayerMapError(f"empty layer map {spec!r}")
        out: list[int] = []
        for item in body.split(","):
            match = _ITEM.match(item)
            if match is None:
                raise LayerMapError(f"cannot parse {item.strip()!r} in layer map {spec!r}; expected e.g. '(0x3,1x3)'")
            index, repeat = int(match.group(1)), int(match.group(2) or 1)
            if repeat < 1:
                raise LayerMapError(f"repeat count must be >= 1 in {item.strip()!r} of layer map {spec!r}")
            out.extend([index] * repeat)
        return validate_layer_map(out, source=repr(spec))
    if isinstance(spec, Sequence):
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in spec):
            raise LayerMapError(f"layer map {list(spec)!r} must hold integers")
        return validate_layer_map(spec, source=repr(list(spec)))
    raise LayerMapError(f"layer map must be a string or a sequence of ints, got {type(spec).__name__}")


def validate_layer_map(layer_map: Sequence[int], source: str = "layer map") -> tuple[int, ...]:
    """Check that ``layer_map`` is non-empty and uses unique layers ``0..U-1`` with no gaps; return it as a tuple.

    Gaps would mean parameters that never run, which only inflates the parameter count.
    """
    out = tuple(int(i) for i in layer_map)
    if not out:
        raise LayerMapError(f"{source}: a layer map needs at least one position")
    if min(out) < 0:
        raise LayerMapError(f"{source}: layer indices must be >= 0, got {out}")
    used = set(out)
    missing = sorted(set(range(max(out) + 1)) - used)
    if missing:
        raise LayerMapError(f"{source}: unique layers must be numbered 0..{max(out)} without gaps; unused {missing}")
    return out


def format_layer_map(layer_map: Sequence[int]) -> str:
    """The paper's compact notation: runs of one index become ``ixn`` (``(0,0,0,1,1,1)`` -> ``"(0x3,1x3)"``)."""
    parts: list[str] = []
    i = 0
    while i < len(layer_map):
        j = i
        while j + 1 < len(layer_map) and layer_map[j + 1] == layer_map[i]:
            j += 1
        count = j - i + 1
        parts.append(f"{layer_map[i]}x{count}" if count > 1 else str(layer_map[i]))
        i = j + 1
    return "(" + ",".join(parts) + ")"
