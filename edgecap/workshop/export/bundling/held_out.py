"""The task-level check's held-out set: the run's val split when its dataset is reachable, else calibration images
kept out of calibration (scored against the FP32 captions)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgecap.workshop.export.bundling.images import CalibImage, EncoderInputs, InputMaker, calibration_inputs, sample
from edgecap.workshop.export.bundling.source import ExportSource

__all__ = ["HeldOut", "carve_held_out", "held_out_from_calibration", "held_out_from_dataset", "held_out_record"]

log = logging.getLogger("edgecap.workshop.export.bundle")

#: When the held-out set comes out of the calibration images: at most this share of them is kept out.
HOLDOUT_SHARE = 0.2


@dataclass
class HeldOut:
    """The task-level check's images: encoder inputs, references (None = score against FP32 captions)."""

    inputs: EncoderInputs
    references: list[list[str]] | None
    description: str


def held_out_from_dataset(source: ExportSource, maker: InputMaker, limit: int) -> HeldOut | None:
    """The first ``limit`` images of the run's val split with their human captions; None when the dataset (or a way
    to turn its images into encoder inputs) is not available."""
    from edgecap.workshop.data.datasets import load_dataset

    if source.data is None or not (maker.from_images or source.features is not None):
        return None  # no dataset, or neither a backbone nor the feature store to turn its images into inputs
    try:
        dataset = load_dataset(source.data)
    except (ValueError, FileNotFoundError) as exc:
        log.warning("held-out set: cannot read the run's dataset %s (%s)", source.data, exc)
        return None
    records = dataset.split("val")[:limit]
    if not records:
        return None
    if maker.from_images:
        paths = [r.path for r in records if r.path is not None]
        inputs = maker.images(paths)
        by_id = {str(r.path): r for r in records}
    else:
        inputs = maker.stored([r.image_id for r in records])
        by_id = {r.image_id: r for r in records}
    if not inputs.ids:
        return None
    refs = [[" ".join(c) for c in by_id[i].captions] for i in inputs.ids]
    return HeldOut(inputs, refs, f"val split of dataset {source.data} ({len(inputs)} images, human references)")


def held_out_record(held_out: HeldOut | None) -> dict[str, Any] | None:
    """The manifest's ``held_out`` entry."""
    if held_out is None:
        return None
    return {"set": held_out.description, "images": len(held_out.inputs), "skipped": len(held_out.inputs.skipped)}


def carve_held_out(images: Sequence[CalibImage], quality_images: int) -> tuple[list[CalibImage], list[CalibImage]]:
    """``(calibration images, held-out images)``: at most :data:`HOLDOUT_SHARE` of the images (and at most
    ``quality_images``), a seeded sample spread over the set, kept out of calibration; none with fewer than 2."""
    images = list(images)
    if not quality_images or len(images) < 2:
        return images, []
    holdout = sample(images, min(quality_images, max(1, int(len(images) * HOLDOUT_SHARE))), seed=1)
    kept = set(holdout)
    return [i for i in images if i not in kept], holdout


def held_out_from_calibration(
    source: ExportSource, maker: InputMaker, holdout: Sequence[CalibImage], calib_description: str
) -> HeldOut | None:
    """The held-out set made of calibration images kept out (references: the torch FP32 captions)."""
    if not holdout:
        return None
    inputs = calibration_inputs(source, maker, holdout, progress=False)
    if not inputs.ids:
        return None
    return HeldOut(
        inputs,
        None,
        f"{len(inputs)} calibration images kept out of calibration ({calib_description}); "
        "references = torch FP32 captions",
    )
