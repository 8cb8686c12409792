"""Per-image benchmark inputs as numpy arrays: the image files of ``--images`` and the batching of per-image inputs
(region features of different counts right-padded and masked)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgecap.runtime.images.load import IMAGE_SUFFIXES, image_files

__all__ = ["Item", "collate", "list_images"]

Item = dict[str, np.ndarray]


def list_images(directory: str | Path, limit: int | None = None) -> list[Path]:
    """Image files under ``directory`` (recursive, sorted), at most ``limit``.

    Raises:
        FileNotFoundError: ``directory`` does not exist.
        ValueError: it holds no image files.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"--images: {directory} is not a directory")
    paths = image_files(directory)
    if not paths:
        raise ValueError(f"--images: no image files in {directory} (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
    return paths[:limit] if limit else paths


def collate(items: Sequence[Item]) -> dict[str, np.ndarray]:
    """Stack per-image inputs into a batch; region features of different counts are right-padded and masked."""
    if not items:
        raise ValueError("collate needs at least one item")
    if "pixel_values" in items[0]:
        return {"pixel_values": np.stack([i["pixel_values"] for i in items])}
    regions = max(int(i["features"].shape[0]) for i in items)
    dim = int(items[0]["features"].shape[1])
    features = np.zeros((len(items), regions, dim), dtype=np.float32)
    boxes = np.zeros((len(items), regions, 4), dtype=np.float32)
    mask = np.zeros((len(items), regions), dtype=bool)
    for row, item in enumerate(items):
        n = int(item["features"].shape[0])
        features[row, :n] = item["features"]
        boxes[row, :n] = item["boxes"]
        mask[row, :n] = item.get("feature_mask", True)
    return {"features": features, "boxes": boxes, "feature_mask": mask}
