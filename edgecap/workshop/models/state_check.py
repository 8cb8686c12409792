"""One comparison of a weights file against the model it should fill: missing, unexpected and mis-shaped tensors.

The backbone loader, the official-checkpoint importers and the Swin renamer all load strictly, and a user who gets
the wrong file needs the same answer from each: which names are absent, which are extra, which have another shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["state_mismatch"]

#: Names listed per kind of problem before the rest is counted.
SHOWN = 6


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(getattr(value, "shape", value))


def _listed(keys: Iterable[str]) -> str:
    keys = sorted(keys)
    more = f" … (+{len(keys) - SHOWN} more)" if len(keys) > SHOWN else ""
    return ", ".join(keys[:SHOWN]) + more


def state_mismatch(found: Mapping[str, Any], expected: Mapping[str, Any], found_label: str = "file") -> str | None:
    """What keeps ``found`` from loading strictly into ``expected`` (tensors or shapes by name), or None if nothing.

    Args:
        found: the weights at hand, name -> tensor (or shape tuple).
        expected: the model's ``state_dict()`` (or name -> shape).
        found_label: how the message names ``found``'s shapes (``"file"``, ``"converted"``).

    Returns:
        ``"missing (n): …; unexpected (n): …; shape mismatch (n): name: file (…) vs model (…)"``, listing only the
        kinds that occur, or None when every name and shape agrees.
    """
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    mismatched = [
        f"{k}: {found_label} {_shape(found[k])} vs model {_shape(expected[k])}"
        for k in sorted(set(found) & set(expected))
        if _shape(found[k]) != _shape(expected[k])
    ]
    parts = [
        f"{label} ({len(items)}): {_listed(items)}"
        for label, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched))
        if items
    ]
    return "; ".join(parts) or None
