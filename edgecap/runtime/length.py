"""Length levels (LaBERT §3.1): caption lengths split into ranges ``[L_low, L_high]``, one learned embedding each.

A caption of ``n`` words belongs to the level whose range holds ``n``; levels are numbered from 1, as in the paper
(``length_level=1`` is the roughest). The 4-level plan is ``[1,9], [10,14], [15,19], [20,25]`` and the 5-level plan
``[1,9], [10,13], [14,17], [18,21], [22,25]`` (Table 1). The official code uses ``(7, 9)`` for level 1 and has no
level for captions shorter than 7 words (bearcatt/LaBERT); we follow the paper's ``[1, 9]``.

Length is counted in words, without EOS (a radix vocabulary's digit tokens are counted per word by the caller).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "LENGTH_PLANS",
    "PAPER_EOS_DECAY",
    "PAPER_REFINE_STEPS",
    "NO_LENGTH_CONTROL",
    "LengthLevelError",
    "check_level",
    "level_bounds",
    "level_of",
    "parse_levels",
]

Levels = tuple[tuple[int, int], ...]

#: The paper's two plans (§3.1, Table 1).
LENGTH_PLANS: dict[str, Levels] = {
    "4level": ((1, 9), (10, 14), (15, 19), (20, 25)),
    "5level": ((1, 9), (10, 13), (14, 17), (18, 21), (22, 25)),
}
#: Refinement steps T per level (§4.4: 10, 15, 20, 25 for the 4-level plan). The paper gives no 5-level LaBERT
#: setting; ours is T = L_high of the level (≈ the autoregressive step count), capped at 25.
PAPER_REFINE_STEPS: dict[str, tuple[int, ...]] = {"4level": (10, 15, 20, 25), "5level": (9, 13, 17, 21, 25)}
#: EOS decay γ per level (§4.2: 0.88 for level 2, 0.95 for level 3, none elsewhere); 5-level: no decay (not given).
PAPER_EOS_DECAY: dict[str, tuple[float, ...]] = {
    "4level": (1.0, 0.88, 0.95, 1.0),
    "5level": (1.0, 1.0, 1.0, 1.0, 1.0),
}


#: What every entry point (``Captioner``, ``edgecap caption``, ``edgecap bench``, ``edgecap eval``) says when a length
#: level is asked of a model without length control.
NO_LENGTH_CONTROL = "this model has no length control; length_level needs LaBERT or a *-len model"


class LengthLevelError(ValueError):
    """A length level out of range, a malformed level plan, or length control asked of a model without it."""


def parse_levels(value: str | Sequence[Sequence[int]]) -> Levels:
    """A plan name (``"4level"``/``"5level"``) or explicit ``[[low, high], ...]`` -> validated tuple of pairs.

    Ranges must be non-empty, start at >= 1 and be contiguous and increasing (every length up to the last
    ``L_high`` has exactly one level).
    """
    if isinstance(value, str):
        try:
            return LENGTH_PLANS[value]
        except KeyError:
            raise LengthLevelError(f"unknown length plan {value!r}; known: {sorted(LENGTH_PLANS)}") from None
    try:
        levels = tuple((int(low), int(high)) for low, high in value)
    except (TypeError, ValueError):
        raise LengthLevelError(f"length levels must be [[low, high], ...] pairs, got {value!r}") from None
    if not levels:
        raise LengthLevelError("length levels must hold at least one [low, high] range")
    expected_low = levels[0][0]
    if expected_low < 1:
        raise LengthLevelError(f"the first level must start at >= 1 word, got {levels[0]}")
    for i, (low, high) in enumerate(levels):
        if low > high or low != expected_low:
            raise LengthLevelError(f"length levels must be contiguous non-empty ranges; level {i + 1} is {(low, high)}")
        expected_low = high + 1
    return levels


def check_level(levels: Levels, level: Any) -> int:
    """``level`` as an int in ``1..len(levels)``, or a clear error."""
    if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= len(levels):
        ranges = ", ".join(f"{i + 1}: {lo}-{hi} words" for i, (lo, hi) in enumerate(levels))
        raise LengthLevelError(f"length_level must be an integer in 1..{len(levels)} ({ranges}), got {level!r}")
    return level


def level_bounds(levels: Levels, level: int) -> tuple[int, int]:
    """``(L_low, L_high)`` of a 1-based ``level``."""
    return levels[check_level(levels, level) - 1]


def level_of(levels: Levels, words: int) -> int:
    """The 1-based level of a caption with ``words`` words; shorter than the first range -> 1, longer than the last
    -> the last level (training truncates such captions to its ``L_high``)."""
    for i, (_, high) in enumerate(levels):
        if words <= high:
            return i + 1
    return len(levels)
