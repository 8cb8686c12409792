"""Calibration images, and encoder inputs made from images (through the run's backbone) or a feature store."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from edgecap.runtime.images.load import IMAGE_SUFFIXES, image_files
from edgecap.workshop.export.bundling import BundleExportError
from edgecap.workshop.export.bundling.console import progress_bar
from edgecap.workshop.export.bundling.source import ExportSource

__all__ = [
    "CalibImage",
    "EncoderInputs",
    "InputMaker",
    "calibration_images",
    "calibration_inputs",
    "check_some_image_loads",
    "describe_skipped",
    "sample",
]

#: Images per encoder-input batch.
BATCH = 16


@dataclass(frozen=True)
class CalibImage:
    """One calibration image: its file, and its dataset image id (the file stem for a plain folder)."""

    path: Path
    image_id: str


def calibration_images(calib: str | Path) -> tuple[list[CalibImage], str]:
    """The images of a calibration folder (searched recursively) or of a dataset directory's train split.

    Returns:
        (images, a description for the manifest).

    Raises:
        FileNotFoundError: ``calib`` does not exist.
        BundleExportError: no image files in it (an empty calibration set).
    """
    from edgecap.workshop.data.datasets import load_dataset

    calib = Path(calib)
    if not calib.exists():
        raise FileNotFoundError(f"calibration set not found: {calib}")
    if (calib / "dataset.json").is_file() or calib.is_file():
        dataset = load_dataset(calib)
        images = [CalibImage(r.path, r.image_id) for r in dataset.split("train") if r.path is not None]
        description = f"train split of dataset {calib}"
    else:
        paths = image_files(calib)
        images = [CalibImage(p, p.stem) for p in paths]
        description = f"images in {calib}"
    if not images:
        raise BundleExportError(
            f"the calibration set is empty: {description} has no images "
            f"(looked for {', '.join(sorted(IMAGE_SUFFIXES))}); INT8 needs representative images"
        )
    return images, description


def describe_skipped(skipped: Mapping[str, str], limit: int = 3) -> str:
    """``path: reason`` for the first few, without the path twice when the reason already names it."""
    return "; ".join(why if why.startswith(path) else f"{path}: {why}" for path, why in list(skipped.items())[:limit])


def check_some_image_loads(images: Sequence[CalibImage], description: str) -> None:
    """Refuse a calibration set none of whose image files decodes (e.g. a folder of non-images named ``*.jpg``),
    stopping at the first one that does: one decode for a good set."""
    from edgecap.runtime.images.load import ImageError, load_image

    failed: dict[str, str] = {}
    for image in images:
        try:
            load_image(image.path)
            return
        except (ImageError, OSError) as exc:
            failed[str(image.path)] = str(exc)
    raise BundleExportError(
        f"the calibration set is empty: none of the {len(images)} files of {description} is a readable image "
        f"({describe_skipped(failed)})"
    )


@dataclass
class EncoderInputs:
    """Images turned into encoder inputs, with the ones that could not be read set aside."""

    ids: list[str] = field(default_factory=list)
    batches: list[dict[str, np.ndarray]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)


class InputMaker:
    """Encoder inputs (``decode_inputs`` of the spec) for lists of images or feature-store ids.

    - backbone in the graph: ``pixel_values`` preprocessed exactly like ``Backbone.preprocess``;
    - backbone outside: the torch backbone's grid features and boxes (all cells valid);
    - region-feature runs: features from the run's feature store, padded with a mask.
    """

    def __init__(self, source: ExportSource, backbone: Any | None, with_backbone: bool) -> None:
        self.source, self.backbone, self.with_backbone = source, backbone, with_backbone
        self._store: Any = None

    @property
    def from_images(self) -> bool:
        return self.backbone is not None

    def images(self, paths: Sequence[Path], progress: Callable[[int], None] | None = None) -> EncoderInputs:
        from edgecap.runtime.images.load import ImageError

        out = EncoderInputs()
        pending: list[tuple[str, np.ndarray]] = []
        for path in paths:
            try:
                pending.append((str(path), cast(Any, self.backbone).preprocess_cfg(path)))  # only with a backbone
            except (ImageError, OSError) as exc:
                out.skipped[str(path)] = str(exc)
            if len(pending) == BATCH:
                self._flush(pending, out)
                pending = []
            if progress is not None:
                progress(1)
        if pending:
            self._flush(pending, out)
        return out

    def _flush(self, pending: list[tuple[str, np.ndarray]], out: EncoderInputs) -> None:
        pixels = np.stack([p for _, p in pending])
        out.ids.extend(i for i, _ in pending)
        if self.with_backbone:
            out.batches.append({"pixel_values": pixels})
            return
        with torch.inference_mode():
            features, boxes = cast(Any, self.backbone)(torch.from_numpy(pixels))  # only with a backbone
        out.batches.append(
            {
                "features": features.float().numpy(),
                "boxes": boxes.float().numpy(),
                "feature_mask": np.ones(features.shape[:2], dtype=bool),
            }
        )

    def stored(self, ids: Sequence[str]) -> EncoderInputs:
        from edgecap.workshop.data.sources import open_feature_source
        from edgecap.workshop.training.batches import FeatureBank

        if self.source.features is None:
            raise BundleExportError(
                f"the {self.source.origin} was trained on precomputed region features and its feature directory is "
                "not available: features for calibration/held-out images cannot be computed"
            )
        if self._store is None:
            self._store = open_feature_source(self.source.features)
        present = [i for i in ids if i in self._store]
        out = EncoderInputs(skipped={i: f"no features in {self.source.features}" for i in ids if i not in self._store})
        if present:
            bank = FeatureBank(self._store, present)
            for start in range(0, len(present), BATCH):
                visual = bank.batch(list(range(start, min(start + BATCH, len(present)))))
                out.batches.append({k: v.numpy() for k, v in visual.as_inputs().items()})
            out.ids.extend(present)
        return out


def sample(items: Sequence[Any], size: int, seed: int = 0) -> list[Any]:
    """``size`` items spread over the whole list (seeded, in original order), or all of them."""
    if len(items) <= size:
        return list(items)
    keep = sorted(random.Random(seed).sample(range(len(items)), size))
    return [items[i] for i in keep]


def calibration_inputs(
    source: ExportSource, maker: InputMaker, images: Sequence[CalibImage], progress: bool
) -> EncoderInputs:
    """Encoder inputs of ``images``: through the backbone, or for a region-feature run from its feature store.

    Raises:
        BundleExportError: a region-feature run whose feature store has none of the images.
    """
    if maker.from_images:
        with progress_bar(len(images), "encoder inputs", progress) as update:
            return maker.images([i.path for i in images], update)
    # A region-feature run: the calibration images must be ones its feature store has features for.
    inputs = maker.stored([i.image_id for i in images])
    if not inputs.ids:
        raise BundleExportError(
            f"the {source.origin} was trained on precomputed region features: INT8 calibration needs images with "
            f"features in {source.features}; pass the run's dataset directory as --calib"
        )
    return inputs
