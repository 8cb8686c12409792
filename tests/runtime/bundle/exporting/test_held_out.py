"""Carving the held-out set out of the calibration images when the run's dataset is not reachable."""

from __future__ import annotations

from pathlib import Path

from edgecap.workshop.export.bundling.held_out import HOLDOUT_SHARE, carve_held_out
from edgecap.workshop.export.bundling.images import CalibImage


def _images(n: int) -> list[CalibImage]:
    return [CalibImage(Path(f"{i:03d}.jpg"), f"{i:03d}") for i in range(n)]


def test_a_seeded_share_is_kept_out_and_the_rest_calibrates() -> None:
    images = _images(50)
    calib, held = carve_held_out(images, quality_images=100)
    assert len(held) == int(50 * HOLDOUT_SHARE) and not set(held) & set(calib)
    assert sorted(calib + held, key=lambda i: i.image_id) == images
    assert carve_held_out(images, quality_images=100) == (calib, held)  # seeded: the same split every time
    assert len(carve_held_out(images, quality_images=3)[1]) == 3  # at most quality_images


def test_nothing_is_kept_out_without_a_check_or_with_a_single_image() -> None:
    assert carve_held_out(_images(50), quality_images=0) == (_images(50), [])
    assert carve_held_out(_images(1), quality_images=10) == (_images(1), [])
    assert len(carve_held_out(_images(2), quality_images=10)[1]) == 1
