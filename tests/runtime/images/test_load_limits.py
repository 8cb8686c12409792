"""The pixel limit of the image loader is checked from the header, before a single pixel is decoded."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

from edgecap.runtime.images.load import ImageError, ImageNotFoundError, image_size, load_image


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any decode fails the test: what is checked must be checked from the header."""

    def refuse(self: ImageFile.ImageFile) -> None:
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)


def test_image_size_reads_the_header_only(no_decoding: None, tmp_path: Path) -> None:
    data = _png(3000, 2000)  # 18 MB once decoded, a few KB encoded
    assert len(data) < 100_000 and image_size(data) == (3000, 2000)
    (tmp_path / "a.png").write_bytes(data)
    assert image_size(tmp_path / "a.png") == (3000, 2000)


def test_image_size_refuses_what_is_not_an_image(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="not a recognised image"):
        image_size(b"not an image")
    with pytest.raises(ImageError, match="empty"):
        image_size(b"")
    with pytest.raises(ImageNotFoundError):
        image_size(tmp_path / "missing.png")


def test_max_pixels_refuses_encoded_bytes_before_decoding(no_decoding: None) -> None:
    with pytest.raises(ImageError, match=r"3000x2000 = 6000000 pixels > limit 5999999"):
        load_image(_png(3000, 2000), max_pixels=5_999_999)


def test_max_pixels_below_pillows_limit_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)
    data = _png(60, 60)  # 3600 pixels: under Pillow's limit, over ours
    assert load_image(data).size == (60, 60)
    with pytest.raises(ImageError, match="too large"):
        load_image(data, max_pixels=3599)
    with pytest.raises(ImageError, match="too large"):
        load_image(np.zeros((60, 60, 3), np.uint8), max_pixels=3599)
