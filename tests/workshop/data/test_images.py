"""load_image: every colour mode lands as correct 8-bit RGB, every bad input fails naming the file."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

from edgecap.runtime.images.load import IMAGE_SUFFIXES, ImageError, ImageNotFoundError, image_files, load_image


def _pixel(image: Image.Image, xy: tuple[int, int] = (0, 0)) -> tuple[int, int, int]:
    assert image.mode == "RGB"
    return image.getpixel(xy)


def _noise(size: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


# ----------------------------------------------------------------------------------------------- colour modes


def test_rgb_png_round_trips_exactly(tmp_path: Path) -> None:
    pixels = _noise(16)
    Image.fromarray(pixels).save(tmp_path / "a.png")
    out = load_image(tmp_path / "a.png")
    assert out.mode == "RGB" and out.size == (16, 16)
    np.testing.assert_array_equal(np.asarray(out), pixels)


def test_str_path_accepted(tmp_path: Path) -> None:
    Image.new("RGB", (3, 2), (1, 2, 3)).save(tmp_path / "a.png")
    assert _pixel(load_image(str(tmp_path / "a.png"))) == (1, 2, 3)


@pytest.mark.parametrize("value", [0, 77, 128, 255])
def test_grayscale_keeps_its_brightness(tmp_path: Path, value: int) -> None:
    Image.new("L", (4, 4), value).save(tmp_path / "g.png")
    assert _pixel(load_image(tmp_path / "g.png")) == (value, value, value)


@pytest.mark.parametrize(("value16", "value8"), [(0, 0), (65535, 255), (32896, 128), (257 * 77, 77), (32767, 127)])
def test_16bit_png_is_rescaled_not_clipped(tmp_path: Path, value16: int, value8: int) -> None:
    Image.fromarray(np.full((5, 6), value16, dtype=np.uint16)).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode.startswith("I;16")
    out = load_image(tmp_path / "g16.png")
    assert out.size == (6, 5)
    assert _pixel(out) == (value8, value8, value8)


def test_32bit_int_image_in_16bit_range_is_rescaled() -> None:
    image = Image.fromarray(np.array([[0, 32896, 65535]], dtype=np.int32))
    assert image.mode == "I"
    out = load_image(image)
    assert [out.getpixel((x, 0))[0] for x in range(3)] == [0, 128, 255]


def test_32bit_int_image_out_of_range_rejected() -> None:
    with pytest.raises(ImageError, match="outside"):
        load_image(Image.fromarray(np.array([[0, 70000]], dtype=np.int32)))


def test_float_mode_image() -> None:
    out = load_image(Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32)))
    assert [out.getpixel((x, 0))[0] for x in range(3)] == [0, 128, 255]
    out = load_image(Image.fromarray(np.array([[0.0, 200.0]], dtype=np.float32)))
    assert [out.getpixel((x, 0))[0] for x in range(2)] == [0, 200]


def test_cmyk_jpeg(tmp_path: Path) -> None:
    Image.new("CMYK", (16, 16), (0, 0, 0, 0)).save(tmp_path / "white.jpg", quality=95)
    Image.new("CMYK", (16, 16), (255, 0, 0, 0)).save(tmp_path / "cyan.jpg", quality=95)
    assert Image.open(tmp_path / "cyan.jpg").mode == "CMYK"
    white = np.asarray(load_image(tmp_path / "white.jpg")).astype(int)
    cyan = np.asarray(load_image(tmp_path / "cyan.jpg")).astype(int)
    assert (white >= 250).all()
    assert (np.abs(cyan[8, 8] - np.array([0, 255, 255])) <= 5).all()


def test_palette_png_with_transparency_composited_on_white(tmp_path: Path) -> None:
    image = Image.new("P", (2, 1))
    image.putpalette([0, 0, 0, 255, 0, 0] + [0] * (256 * 3 - 6))
    image.putpixel((0, 0), 0)
    image.putpixel((1, 0), 1)
    image.save(tmp_path / "p.png", transparency=0)
    reopened = Image.open(tmp_path / "p.png")
    assert reopened.mode == "P" and "transparency" in reopened.info
    out = load_image(tmp_path / "p.png")
    assert _pixel(out, (0, 0)) == (255, 255, 255)  # transparent black → white background, not black
    assert _pixel(out, (1, 0)) == (255, 0, 0)


def test_palette_png_without_transparency(tmp_path: Path) -> None:
    Image.fromarray(_noise(8)).convert("P").save(tmp_path / "p.png")
    reference = Image.open(tmp_path / "p.png").convert("RGB")
    np.testing.assert_array_equal(np.asarray(load_image(tmp_path / "p.png")), np.asarray(reference))


def test_rgba_composited_with_configurable_background(tmp_path: Path) -> None:
    rgba = np.zeros((1, 3, 4), dtype=np.uint8)
    rgba[0, 0] = (10, 20, 30, 255)  # opaque
    rgba[0, 1] = (10, 20, 30, 0)  # fully transparent
    rgba[0, 2] = (0, 0, 0, 128)  # half-transparent black over white → mid-gray
    Image.fromarray(rgba).save(tmp_path / "a.png")
    out = load_image(tmp_path / "a.png")
    assert _pixel(out, (0, 0)) == (10, 20, 30)
    assert _pixel(out, (1, 0)) == (255, 255, 255)
    assert all(abs(c - 127) <= 1 for c in _pixel(out, (2, 0)))
    assert _pixel(load_image(tmp_path / "a.png", background=(0, 0, 255)), (1, 0)) == (0, 0, 255)


def test_la_image(tmp_path: Path) -> None:
    Image.new("LA", (2, 2), (100, 255)).save(tmp_path / "la.png")
    assert _pixel(load_image(tmp_path / "la.png")) == (100, 100, 100)
    Image.new("LA", (2, 2), (100, 0)).save(tmp_path / "la0.png")
    assert _pixel(load_image(tmp_path / "la0.png")) == (255, 255, 255)


def test_1bit_image(tmp_path: Path) -> None:
    image = Image.new("1", (2, 1), 0)
    image.putpixel((1, 0), 1)
    image.save(tmp_path / "b.png")
    out = load_image(tmp_path / "b.png")
    assert _pixel(out, (0, 0)) == (0, 0, 0) and _pixel(out, (1, 0)) == (255, 255, 255)


def test_exif_orientation_applied(tmp_path: Path) -> None:
    pixels = np.zeros((2, 3, 3), dtype=np.uint8)  # 3 wide, 2 high; red top-left corner
    pixels[0, 0] = (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    Image.fromarray(pixels).save(tmp_path / "o.png", exif=exif)
    out = load_image(tmp_path / "o.png")
    assert out.size == (2, 3)
    assert _pixel(out, (1, 0)) == (255, 0, 0)  # top-left moves to top-right after a clockwise turn


def test_animated_gif_uses_first_frame(tmp_path: Path) -> None:
    frames = [Image.new("RGB", (4, 4), c) for c in ((255, 0, 0), (0, 0, 255))]
    frames[0].save(tmp_path / "a.gif", save_all=True, append_images=frames[1:])
    assert _pixel(load_image(tmp_path / "a.gif")) == (255, 0, 0)


def test_pil_image_input_not_mutated() -> None:
    image = Image.new("L", (3, 3), 50)
    out = load_image(image)
    assert image.mode == "L" and out is not image and _pixel(out) == (50, 50, 50)


# ----------------------------------------------------------------------------------------------- numpy arrays


@pytest.mark.parametrize(
    ("array", "expected"),
    [
        (np.full((2, 3), 40, np.uint8), (40, 40, 40)),
        (np.full((2, 3, 1), 40, np.uint8), (40, 40, 40)),
        (np.tile(np.array([1, 2, 3], np.uint8), (2, 3, 1)), (1, 2, 3)),
        (np.tile(np.array([1, 2, 3, 255], np.uint8), (2, 3, 1)), (1, 2, 3)),
        (np.tile(np.array([1, 2, 3, 0], np.uint8), (2, 3, 1)), (255, 255, 255)),
        (np.full((2, 3), 65535, np.uint16), (255, 255, 255)),
        (np.full((2, 3, 3), 32896, np.uint16), (128, 128, 128)),
        (np.full((2, 3, 3), 0.5, np.float32), (128, 128, 128)),
        (np.full((2, 3), 1.0, np.float64), (255, 255, 255)),
        (np.full((2, 3, 3), 0.25, np.float16), (64, 64, 64)),
    ],
)
def test_array_inputs(array: np.ndarray, expected: tuple[int, int, int]) -> None:
    out = load_image(array)
    assert out.size == (3, 2)
    assert _pixel(out) == expected


def test_non_contiguous_array() -> None:
    pixels = _noise(8)
    view = pixels[:, ::-1]
    np.testing.assert_array_equal(np.asarray(load_image(view)), view)


@pytest.mark.parametrize(
    ("array", "match"),
    [
        (np.zeros((2, 3, 2), np.uint8), "shape"),
        (np.zeros((1, 2, 3, 3), np.uint8), "shape"),
        (np.zeros((5,), np.uint8), "shape"),
        (np.zeros((0, 3, 3), np.uint8), "zero-size"),
        (np.zeros((2, 3), np.int64), "dtype"),
        (np.zeros((2, 3), bool), "dtype"),
        (np.array([[0.1, np.nan]], np.float32), "NaN"),
        (np.array([[0.1, np.inf]], np.float32), "NaN"),
        (np.array([[0.0, 255.0]], np.float32), r"\[0, 1\]"),
        (np.array([[-0.1, 0.5]], np.float32), r"\[0, 1\]"),
    ],
)
def test_bad_arrays_rejected(array: np.ndarray, match: str) -> None:
    with pytest.raises(ImageError, match=match):
        load_image(array)


def test_unsupported_input_type() -> None:
    with pytest.raises(ImageError, match="int"):
        load_image(42)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------- bad files


def test_missing_file_names_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.jpg"
    with pytest.raises(ImageNotFoundError, match="nope.jpg") as info:
        load_image(path)
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, ValueError)


def test_directory_rejected(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="directory"):
        load_image(tmp_path)


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(ImageError, match=r"empty\.png.*empty file"):
        load_image(tmp_path / "empty.png")


def test_garbage_bytes(tmp_path: Path) -> None:
    (tmp_path / "junk.jpg").write_bytes(np.random.default_rng(1).bytes(2048))
    with pytest.raises(ImageError, match=r"junk\.jpg.*not a recognised image"):
        load_image(tmp_path / "junk.jpg")


def test_text_file_named_png(tmp_path: Path) -> None:
    (tmp_path / "notes.png").write_text("a dog on a skateboard\n")
    with pytest.raises(ImageError, match=r"notes\.png"):
        load_image(tmp_path / "notes.png")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_image_rejected(tmp_path: Path, fmt: str) -> None:
    buffer = io.BytesIO()
    Image.fromarray(_noise(64)).save(buffer, fmt)
    data = buffer.getvalue()
    path = tmp_path / f"cut.{fmt.lower()}"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError, match=rf"cut\.{fmt.lower()}.*(truncated|corrupt|decode)"):
        load_image(path)
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_png_with_only_a_header(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    Image.fromarray(_noise(16)).save(buffer, "PNG")
    (tmp_path / "head.png").write_bytes(buffer.getvalue()[:40])
    with pytest.raises(ImageError, match=r"head\.png"):
        load_image(tmp_path / "head.png")


def test_max_pixels_limit(tmp_path: Path) -> None:
    Image.new("RGB", (20, 20)).save(tmp_path / "big.png")
    with pytest.raises(ImageError, match=r"big\.png.*too large"):
        load_image(tmp_path / "big.png", max_pixels=399)
    assert load_image(tmp_path / "big.png", max_pixels=400).size == (20, 20)
    with pytest.raises(ImageError, match="too large"):
        load_image(np.zeros((20, 20), np.uint8), max_pixels=100)


def test_pil_decompression_bomb_warning_and_error_become_image_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Image.new("RGB", (20, 20)).save(tmp_path / "bomb.png")  # 400 pixels
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300)  # 400 > 300: PIL only warns
    with pytest.raises(ImageError, match=r"bomb\.png.*too large"):
        load_image(tmp_path / "bomb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 150)  # 400 > 2 * 150: PIL raises
    with pytest.raises(ImageError, match=r"bomb\.png.*decompression bomb"):
        load_image(tmp_path / "bomb.png")
    # An explicit, larger limit lifts PIL's limit for this call only.
    assert load_image(tmp_path / "bomb.png", max_pixels=1000).size == (20, 20)
    assert Image.MAX_IMAGE_PIXELS == 150


def test_zero_size_pil_image() -> None:
    with pytest.raises(ImageError, match="zero-size"):
        load_image(Image.new("RGB", (0, 4)))


def test_corrupt_tiff_directory_is_image_error(tmp_path: Path) -> None:
    """Found by tests/fuzz: one flipped byte in a TIFF's first IFD (byte 130 of this file, 0 -> 1) made PIL raise
    TypeError ("Missing dimensions") from ``n_frames``; every decoding failure must be an ImageError naming the file."""
    import io

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, size=(12, 17, 3), dtype=np.uint8)).save(buf, "TIFF")
    data = bytearray(buf.getvalue())
    data[130] = 1
    (tmp_path / "flipped.tif").write_bytes(bytes(data))
    with pytest.raises(ImageError, match=r"flipped\.tif: cannot"):
        load_image(tmp_path / "flipped.tif")


def test_image_files_finds_images_by_suffix_recursively(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    for name in ("b.JPG", "sub/a.png", "notes.txt", "sub/c.webp"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "dir.jpg").mkdir()  # a folder named like an image is not one
    found = [p.relative_to(tmp_path).as_posix() for p in image_files(tmp_path)]
    assert found == ["b.JPG", "sub/a.png", "sub/c.webp"]
    assert ".jpeg" in IMAGE_SUFFIXES


# ----------------------------------------------------------------------------------------------- encoded bytes


def test_encoded_bytes_decode_like_the_file(tmp_path: Path) -> None:
    """What a client uploads to a server: the bytes of a file give the same pixels as the file."""
    rgb = np.random.default_rng(7).integers(0, 256, (9, 11, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "x.png")
    data = (tmp_path / "x.png").read_bytes()
    for source in (data, bytearray(data), memoryview(data)):
        assert np.array_equal(np.asarray(load_image(source)), np.asarray(load_image(tmp_path / "x.png")))


@pytest.mark.parametrize(
    "data,message",
    [
        (b"", "<0 encoded bytes>: empty (0 bytes)"),
        (b"a dog on a skateboard", "<21 encoded bytes>: not a recognised image file"),
        # a PNG cut two bytes after its signature: PIL cannot identify it
        (b"\x89PNG\r\n\x1a\n\x00\x00", "<10 encoded bytes>: not a recognised image file"),
    ],
)
def test_bad_encoded_bytes_are_image_errors(data: bytes, message: str) -> None:
    with pytest.raises(ImageError) as caught:
        load_image(data)
    assert str(caught.value) == message


def test_truncated_encoded_jpeg_is_an_image_error() -> None:
    out = io.BytesIO()
    Image.fromarray(np.full((64, 64, 3), 120, np.uint8)).save(out, format="JPEG")
    with pytest.raises(ImageError, match="encoded bytes"):
        load_image(out.getvalue()[: len(out.getvalue()) // 2])
