"""A compressed run's recipe in its bundle, and the FP32 model its task-level check compares against.

Compression commands (QAT, distillation, pruning, sparsity) append one step record each to the run config's
optional ``"compression"`` list (``{"kind": "qat", "parent": "/abs/run", ...}``). Export copies it into the manifest
as ``{"steps": [...], "recipe": "distillation+pruning"}`` so a report can name how a bundle was made.

A step that derived the run from another one names that run as ``parent``: its FP32 weights are the model the
compressed one stands in for, so the task-level check measures against the nearest such parent (the last step that
names one). Where that run is gone, the check falls back to the run itself and the record says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from edgecap.workshop.export.bundling import BundleExportError

__all__ = ["compression_record", "compression_steps", "reference_parent", "reference_source"]

log = logging.getLogger("edgecap.workshop.export.bundle")

#: The task-level check's reference label when the model is the exported run itself.
THIS_RUN = "torch FP32"


def compression_steps(value: Any, where: str) -> list[dict[str, Any]]:
    """The ``compression`` list of a run config (``[]`` when absent), checked: each step an object with a ``kind``.

    Raises:
        BundleExportError: not a list of objects with a non-empty string ``kind``.
    """
    if value is None:
        return []
    if not isinstance(value, list):
        raise BundleExportError(f"{where}: 'compression' must be a list of step records, got {type(value).__name__}")
    for index, step in enumerate(value):
        if not isinstance(step, Mapping) or not isinstance(step.get("kind"), str) or not step["kind"]:
            raise BundleExportError(
                f"{where}: compression[{index}] must be an object with a 'kind' string, got {step!r}"
            )
    return [dict(step) for step in value]


def compression_record(steps: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The manifest's ``compression`` object, or None for an uncompressed run (the field is then left out)."""
    if not steps:
        return None
    return {"steps": [dict(s) for s in steps], "recipe": "+".join(str(s["kind"]) for s in steps)}


def reference_parent(steps: Sequence[Mapping[str, Any]]) -> Path | None:
    """The parent run named by the last step that names one, or None."""
    for step in reversed(steps):
        parent = step.get("parent")
        if isinstance(parent, str) and parent:
            return Path(parent)
    return None


def reference_source(
    source: Any, backbone_weights: Path | None, load: Callable[[Path, Path | None], Any]
) -> tuple[Any, str, Any]:
    """``(model, label, parent)``: the torch FP32 model the task-level check compares against, how the record names
    it, and the parent's export source (None when the run itself is the reference): a pixels-in check runs the
    parent's own backbone in front of its captioner (QAT tunes the backbone too).

    The exported run itself (label ``torch FP32``) unless its compression steps name a parent run: then that run's
    model (``torch FP32 (parent run PATH)``); a parent that cannot be loaded, or whose vocabulary differs, falls back
    to the run itself with a warning (``torch FP32 (this run; parent missing)``). ``load``: ``source.load_source``
    (passed in: that module imports this one)."""
    parent = reference_parent(source.compression)
    if parent is None:
        return source.model, THIS_RUN, None
    try:
        loaded = load(parent, backbone_weights)
    except (ValueError, FileNotFoundError, OSError) as exc:  # RunError and BundleExportError are ValueErrors
        log.warning("export: the FP32 parent %s cannot be loaded (%s); checking against this run", parent, exc)
        return source.model, f"{THIS_RUN} (this run; parent missing)", None
    if loaded.vocab.size != source.vocab.size:
        log.warning("export: the FP32 parent %s has another vocabulary; checking against this run", parent)
        return source.model, f"{THIS_RUN} (this run; parent's vocabulary differs)", None
    return loaded.model, f"{THIS_RUN} (parent run {parent})", loaded
