"""Fuzz the image loader: any bytes on disk either load to an RGB image or raise ImageError."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from edgecap.runtime.images.load import ImageError, load_image
from edgecap.runtime.images.preprocess import PreprocessCfg

from .strategies import byte_mutations

# A cap on decoded pixels keeps a mutated header that claims a huge canvas from costing seconds per example.
MAX_PIXELS = 1 << 20
CFG = PreprocessCfg(image_size=16, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), crop_mode="center")

#: (format, mode, save kwargs) for each format users hand us; modes cover palette, alpha, gray and 16-bit.
FORMATS = {
    "PNG": [("RGB", {}), ("P", {}), ("RGBA", {}), ("I;16", {})],
    "JPEG": [("RGB", {"quality": 80}), ("L", {}), ("CMYK", {})],
    "GIF": [("P", {})],
    "BMP": [("RGB", {}), ("L", {})],
    "TIFF": [("RGB", {}), ("F", {}), ("RGB", {"compression": "tiff_lzw"})],
    "WEBP": [("RGB", {"quality": 70}), ("RGBA", {"lossless": True})],
}


def _encode(fmt: str, mode: str, kwargs: dict, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    rgb = Image.fromarray(rng.integers(0, 256, size=(12, 17, 3), dtype=np.uint8))
    if mode == "I;16":
        image = Image.fromarray(rng.integers(0, 65536, size=(12, 17), dtype=np.uint16))
    elif mode == "F":
        image = Image.fromarray(rng.uniform(0, 1, size=(12, 17)).astype(np.float32))
    elif mode == "RGBA":
        image = rgb.convert("RGBA")
    else:
        image = rgb.convert(mode)
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


SAMPLES = [_encode(fmt, mode, kw) for fmt, variants in FORMATS.items() for mode, kw in variants]
SAMPLE_IDS = [f"{fmt}-{mode}-{i}" for fmt, variants in FORMATS.items() for i, (mode, _) in enumerate(variants)]


@pytest.fixture(scope="module")
def image_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-images") / "input"


def _check(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    try:
        image = load_image(path, max_pixels=MAX_PIXELS)
    except ImageError:
        return
    assert image.mode == "RGB" and image.width > 0 and image.height > 0
    pixels = CFG(image)
    assert pixels.shape == (3, 16, 16) and np.isfinite(pixels).all()


def test_samples_load(image_file: Path) -> None:
    """The unmutated seeds all load (otherwise the mutations below would only test the error path)."""
    for data, name in zip(SAMPLES, SAMPLE_IDS, strict=True):
        image_file.write_bytes(data)
        assert load_image(image_file).mode == "RGB", name


@given(data=st.binary(max_size=512))
def test_random_bytes(image_file: Path, data: bytes) -> None:
    _check(image_file, data)


@given(data=st.sampled_from(SAMPLES).flatmap(byte_mutations))
def test_mutated_files(image_file: Path, data: bytes) -> None:
    _check(image_file, data)


@given(head=st.sampled_from(SAMPLES), tail=st.sampled_from(SAMPLES), cut=st.integers(1, 64), at=st.integers(0, 200))
def test_header_splices(image_file: Path, head: bytes, tail: bytes, cut: int, at: int) -> None:
    """One format's header on another format's body: what a mislabelled or half-overwritten download looks like."""
    _check(image_file, head[:cut] + tail[at:])
