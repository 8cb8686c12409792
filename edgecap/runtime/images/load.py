"""Load any image a user is likely to hand us into an 8-bit RGB ``PIL.Image``, or fail naming the file.

Caption datasets are messy: COCO alone holds grayscale and CMYK JPEGs, and scraped data adds 16-bit PNGs, palette
images with transparency and truncated downloads. Common pipelines get several of these wrong (a plain
``convert("RGB")`` clips 16-bit images to white, and some published pipelines turn grayscale into black images), and a
silently wrong image becomes a silently wrong feature. Every conversion here is explicit:

* ``1``/``L``/``P``/``YCbCr``/``CMYK``/``HSV`` → PIL's own RGB conversion;
* ``I;16*`` (16-bit) → rescaled to 8 bit with ``round(v * 255 / 65535)``, so 65535 → 255 and mid-gray stays mid-gray;
* ``I`` (32-bit int) → 16-bit rescale when the values fit in ``[0, 65535]`` (how PIL opens 16-bit data), else error;
* ``F`` (float) → values in ``[0, 1]`` are scaled by 255, values in ``[0, 255]`` are kept, anything else is an error;
* anything with transparency (``RGBA``, ``LA``, ``PA``, ``P`` with a ``transparency`` entry, ``RGBa``) is
  alpha-composited onto a **white** background (configurable) — transparent regions of logos and scans are meant
  to be seen on a page, and a white page is what a captioner's training photos resemble far more than a black void;
* EXIF orientation is applied, so a portrait phone photo is upright.

Truncated files are never padded (PIL's ``LOAD_TRUNCATED_IMAGES`` is left untouched and must stay ``False``);
the whole image is decoded with ``.load()`` so a broken stream fails here rather than later in a worker.
"""

from __future__ import annotations

import io
import os
import threading
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

__all__ = [
    "DEFAULT_BACKGROUND",
    "IMAGE_SUFFIXES",
    "ImageError",
    "ImageLike",
    "ImageNotFoundError",
    "image_files",
    "image_size",
    "load_image",
]

ImageLike = str | os.PathLike | Image.Image | np.ndarray | bytes | bytearray | memoryview

DEFAULT_BACKGROUND: tuple[int, int, int] = (255, 255, 255)

#: File suffixes taken for images when a folder is searched (calibration sets, ``edgecap bench --images``).
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm"})

# Opening an image reads only its header; the lock serialises the few process-global settings touched there
# (warning filters, PIL's pixel limit) so concurrent loader threads cannot undo each other's settings.
_OPEN_LOCK = threading.Lock()

_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
_DIRECT_RGB_MODES = {"1", "L", "P", "RGB", "RGBX", "CMYK", "YCbCr", "HSV", "LAB"}


class ImageError(ValueError):
    """An input could not be turned into an RGB image; the message names the file (or the array/image)."""


class ImageNotFoundError(ImageError, FileNotFoundError):
    """The image path does not exist (catchable as both ``ImageError`` and ``FileNotFoundError``)."""


def load_image(
    src: ImageLike,
    *,
    max_pixels: int | None = None,
    background: tuple[int, int, int] = DEFAULT_BACKGROUND,
) -> Image.Image:
    """Return ``src`` as a fully decoded 8-bit RGB image.

    Args:
        src: a path (``str``/``PathLike``), the encoded bytes of an image file (JPEG, PNG, WebP, ...: what a
            client uploads to a server), a ``PIL.Image.Image`` or a numpy array ``(H, W)``, ``(H, W, 1)``,
            ``(H, W, 3)`` or ``(H, W, 4)`` of dtype ``uint8``, ``uint16`` or float in ``[0, 1]``.
        max_pixels: largest accepted ``width * height``; ``None`` uses ``PIL.Image.MAX_IMAGE_PIXELS`` (the
            decompression-bomb limit). Larger values lift PIL's limit for this call only.
        background: RGB colour that transparent pixels are composited onto.

    Raises:
        ImageNotFoundError: the path does not exist.
        ImageError: the input is empty, not an image, truncated, too large, zero-sized or an unusable array.
    """
    if isinstance(src, np.ndarray):
        image = _from_array(src)
        name = f"<array {src.shape} {src.dtype}>"
    elif isinstance(src, Image.Image):
        name = str(getattr(src, "filename", "") or f"<PIL image {src.mode} {src.size}>")
        image = _decode(src, name)
    elif isinstance(src, (str, os.PathLike)):
        return _load_path(Path(src), max_pixels=max_pixels, background=background)
    elif isinstance(src, (bytes, bytearray, memoryview)):
        return _load_encoded(bytes(src), max_pixels=max_pixels, background=background)
    else:
        raise ImageError(
            f"cannot load an image from {type(src).__name__}; expected a path, encoded bytes, PIL image or numpy array"
        )
    _check_pixels(image.size, name, max_pixels)
    return _to_rgb(image, name, background)


def image_size(src: str | os.PathLike | bytes | bytearray | memoryview) -> tuple[int, int]:
    """``(width, height)`` of an image file or encoded bytes from its header alone (Pillow opens lazily).

    Nothing is decoded, so a server can refuse an image by its pixel count before a decode spends the memory (a
    236 KB PNG can hold 9000×9000 pixels: 243 MB once decoded).

    Raises:
        ImageNotFoundError: the path does not exist.
        ImageError: empty, not an image, an unreadable header, or beyond PIL's decompression-bomb limit.
    """
    if isinstance(src, (bytes, bytearray, memoryview)):
        data = bytes(src)
        name = f"<{len(data)} encoded bytes>"
        if not data:
            raise ImageError(f"{name}: empty (0 bytes)")
        source: Path | io.BytesIO = io.BytesIO(data)
    else:
        source = Path(src)
        name = str(source)
        if not source.exists():
            raise ImageNotFoundError(f"image file not found: {source}")
        if not source.is_file():
            raise ImageError(f"{source}: not an image file")
    with _open(source, name, None) as image:
        return image.size


def _load_path(path: Path, *, max_pixels: int | None, background: tuple[int, int, int]) -> Image.Image:
    if not path.exists():
        raise ImageNotFoundError(f"image file not found: {path}")
    if path.is_dir():
        raise ImageError(f"{path}: is a directory, not an image file")
    if path.stat().st_size == 0:
        raise ImageError(f"{path}: empty file (0 bytes)")
    return _load_opened(path, str(path), max_pixels=max_pixels, background=background)


def _load_encoded(data: bytes, *, max_pixels: int | None, background: tuple[int, int, int]) -> Image.Image:
    name = f"<{len(data)} encoded bytes>"
    if not data:
        raise ImageError(f"{name}: empty (0 bytes)")
    return _load_opened(io.BytesIO(data), name, max_pixels=max_pixels, background=background)


def _load_opened(
    source: Path | io.BytesIO, name: str, *, max_pixels: int | None, background: tuple[int, int, int]
) -> Image.Image:
    image = _open(source, name, max_pixels)
    try:
        _check_pixels(image.size, name, max_pixels)
        image = _decode(image, name)
        return _to_rgb(image, name, background)
    finally:
        image.close()


def _open(path: Path | io.BytesIO, name: str, max_pixels: int | None) -> Image.Image:
    """Read the header, turning PIL's decompression-bomb warning into an error."""
    with _OPEN_LOCK, warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        pil_limit = Image.MAX_IMAGE_PIXELS
        lift = max_pixels is not None and pil_limit is not None and max_pixels > pil_limit
        if lift:
            Image.MAX_IMAGE_PIXELS = max_pixels
        try:
            return Image.open(path)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise ImageError(f"{name}: image too large, possible decompression bomb ({exc})") from exc
        except Image.UnidentifiedImageError as exc:
            raise ImageError(f"{name}: not a recognised image file") from exc
        except MemoryError:
            raise
        except Exception as exc:  # PIL's plugins raise TypeError/KeyError/struct.error/... on corrupt headers too
            raise ImageError(f"{name}: cannot read image header: {exc}") from exc
        finally:
            if lift:
                Image.MAX_IMAGE_PIXELS = pil_limit


def _check_pixels(size: tuple[int, int], name: str, max_pixels: int | None) -> None:
    width, height = size
    if width <= 0 or height <= 0:
        raise ImageError(f"{name}: zero-size image ({width}x{height})")
    limit = Image.MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    if limit is not None and width * height > limit:
        raise ImageError(
            f"{name}: image too large ({width}x{height} = {width * height} pixels > limit {limit}); "
            "possible decompression bomb — pass max_pixels to allow it"
        )


def _decode(image: Image.Image, name: str) -> Image.Image:
    """Decode every pixel now (first frame of animations), then apply EXIF orientation."""
    try:
        if getattr(image, "n_frames", 1) > 1:
            image.seek(0)
        image.load()
        # exif_transpose returns a copy with the orientation tag removed, so applying it twice is harmless.
        return ImageOps.exif_transpose(image)
    except MemoryError:
        raise
    except Exception as exc:  # corrupt data reaches PIL paths that raise TypeError, KeyError, struct.error, ...
        reason = "truncated or corrupt image data" if "truncated" in str(exc) or isinstance(exc, EOFError) else exc
        raise ImageError(f"{name}: cannot decode image: {reason}") from exc


def _to_rgb(image: Image.Image, name: str, background: tuple[int, int, int]) -> Image.Image:
    mode = image.mode
    if mode == "P" and "transparency" in image.info:
        image, mode = image.convert("RGBA"), "RGBA"
    if mode in _ALPHA_MODES:
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*background, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    if mode.startswith("I;16"):
        return _gray_array_to_rgb(_scale_16bit(np.asarray(image)))
    if mode == "I":
        values = np.asarray(image)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise ImageError(f"{name}: 32-bit integer image with values outside [0, 65535]; cannot map to 8 bit")
        return _gray_array_to_rgb(_scale_16bit(values))
    if mode == "F":
        return _gray_array_to_rgb(_scale_float(np.asarray(image, dtype=np.float64), name, allow_255=True))
    if mode in _DIRECT_RGB_MODES:
        try:
            return image.convert("RGB")
        except ValueError as exc:
            raise ImageError(f"{name}: cannot convert colour mode {mode!r} to RGB") from exc
    raise ImageError(f"{name}: unsupported image mode {mode!r}")


def _from_array(array: np.ndarray) -> Image.Image:
    name = f"<array {array.shape} {array.dtype}>"
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)):
        raise ImageError(f"{name}: expected an array of shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4)")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ImageError(f"{name}: zero-size image")
    if array.dtype == np.uint8:
        pixels = array
    elif array.dtype == np.uint16:
        pixels = _scale_16bit(array)
    elif np.issubdtype(array.dtype, np.floating):
        pixels = _scale_float(array.astype(np.float64), name, allow_255=False)
    else:
        raise ImageError(f"{name}: unsupported dtype {array.dtype}; use uint8, uint16 or float in [0, 1]")
    # uint8 (H, W) → L, (H, W, 3) → RGB, (H, W, 4) → RGBA; _to_rgb then handles alpha like any file.
    return Image.fromarray(np.ascontiguousarray(pixels))


def _scale_16bit(values: np.ndarray) -> np.ndarray:
    """Map ``[0, 65535]`` onto ``[0, 255]`` with rounding (65535 → 255, 32768 → 128), never clipping."""
    wide = values.astype(np.uint32)
    return ((wide * 255 + 32767) // 65535).astype(np.uint8)


def _scale_float(values: np.ndarray, name: str, *, allow_255: bool) -> np.ndarray:
    if not np.isfinite(values).all():
        raise ImageError(f"{name}: image contains NaN or infinite values")
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if low >= 0.0 and high <= 1.0:
        return np.rint(values * 255.0).astype(np.uint8)
    if allow_255 and low >= 0.0 and high <= 255.0:
        return np.rint(values).astype(np.uint8)
    expected = "[0, 1] or [0, 255]" if allow_255 else "[0, 1] (divide uint8-range floats by 255)"
    raise ImageError(f"{name}: float values span [{low:g}, {high:g}], expected {expected}")


def _gray_array_to_rgb(gray: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(gray)).convert("RGB")


def image_files(directory: str | os.PathLike) -> list[Path]:
    """Every file under ``directory`` (recursively) with an :data:`IMAGE_SUFFIXES` suffix (any case), sorted."""
    return sorted(p for p in Path(directory).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
