"""Fixtures of the serving tests: a pixels-in bundle, its captioner, and small images."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.runtime.bundle.helpers import pixel_bundle


@pytest.fixture(scope="session")
def served_bundle(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pixels-in FP32 bundle whose directory name is a valid Triton model name."""
    return pixel_bundle(tiny_data, tmp_path_factory)[0]


def images(count: int, seed: int = 0) -> list[np.ndarray]:
    """``count`` small RGB arrays of different sizes (ragged: a dynamic batch mixes shapes)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (40 + 3 * i, 48 + 5 * (i % 4), 3), dtype=np.uint8) for i in range(count)]


def png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()
