"""How one :meth:`Captioner.caption <edgecap.runtime.captioner.Captioner.caption>` call becomes decode calls.

Images are listed (:func:`as_image_list`), each gets its options (:func:`per_image`), images asking the same options
are grouped and cut into batches (:func:`plan`): one decode call per batch. A beam width or a length level belongs to
a whole decode call, so grouping is what lets one call (or one served batch) mix them; because the decoders are
batch-invariant, no caption depends on its group or batch. With ``errors="skip"`` (:func:`skipping_batches`) an
image that cannot be loaded or preprocessed leaves its batch with a :class:`SkippedImageWarning` instead.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

import numpy as np

from edgecap.runtime.backends.registry import CaptionerError

__all__ = [
    "BATCH",
    "Key",
    "SkippedImageWarning",
    "as_image_list",
    "batch_rows",
    "check_call",
    "per_image",
    "plan",
    "row_index",
    "skipping_batches",
]

#: Images per decode call when the caller gives no ``batch_size``.
BATCH = 16
#: ``(beam, length_level)`` of an image (None: the captioner's default): images with one key decode together.
Key = tuple[int | None, int | None]
#: The modules a skip warning looks past, to point at the caller's line.
_OWN_MODULES = frozenset({__name__, "edgecap.runtime.captioner"})


class SkippedImageWarning(UserWarning):
    """``Captioner.batch(..., errors="skip")`` left out an image it could not load or preprocess."""

    def __init__(self, index: int, image: Any, error: Exception) -> None:
        super().__init__(f"image {index} skipped: {error}")
        self.index, self.image, self.error = index, image, error


def check_call(batch_size: Any, errors: Any) -> int | None:
    """``batch_size`` (None or an integer >= 1), refusing it or ``errors`` (``"raise"``/``"skip"``) otherwise."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise CaptionerError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if errors not in ("raise", "skip"):
        raise CaptionerError(f"errors must be 'raise' or 'skip', got {errors!r}")
    return batch_size


def as_image_list(images: Any) -> list[Any]:
    """One image (a path, encoded bytes, a PIL image or an H×W×C / H×W array) or a sequence of them -> a list of images.

    A single array is one image, not a sequence of rows; a 4-D array is a batch of images along axis 0.
    """
    if isinstance(images, (str, os.PathLike, bytes, bytearray, memoryview)):  # one path, or one encoded image
        return [images]
    if isinstance(images, np.ndarray):
        if images.ndim in (2, 3):
            return [images]
        if images.ndim == 4:
            return list(images)
        raise CaptionerError(f"an image array must be H×W, H×W×C or N×H×W×C, got shape {images.shape}")
    if hasattr(images, "getbands"):  # a PIL image
        return [images]
    return list(images)


def per_image(name: str, value: Any, count: int) -> list[Any]:
    """One option value per image: a scalar (or None) for all of them, or a sequence of ``count`` values."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise CaptionerError(f"{name}: {len(value)} value(s) for {count} image(s)")
        return [int(v) if isinstance(v, np.integer) else v for v in value]
    return [int(value) if isinstance(value, np.integer) else value] * count


def plan(keys: Mapping[int, Key], size: int) -> Iterator[tuple[Key, list[int]]]:
    """``(key, image indices)`` of each decode call: the images of one key (in the order first asked), ``size`` at
    most per call, ascending."""
    groups: dict[Key, list[int]] = {}
    for index, key in keys.items():
        groups.setdefault(key, []).append(index)
    for key, members in groups.items():
        for start in range(0, len(members), size):
            yield key, members[start : start + size]


def batch_rows(arrays: Mapping[str, Any]) -> int:
    """The batch size of prepared encoder inputs, refusing an empty mapping or disagreeing first dimensions."""
    if not arrays:
        raise CaptionerError("encoder inputs are empty: expected batch-first arrays such as pixel_values or features")
    counts = {name: int(value.shape[0]) if len(value.shape) else -1 for name, value in arrays.items()}
    if len(set(counts.values())) != 1 or -1 in counts.values():
        raise CaptionerError(f"encoder inputs must be batch-first arrays of one batch size, got rows {counts}")
    return next(iter(counts.values()))


def row_index(rows: list[int]) -> slice | list[int]:
    """An index of ``rows`` (ascending): a slice (a view, no copy) where they are consecutive."""
    return slice(rows[0], rows[-1] + 1) if rows[-1] - rows[0] == len(rows) - 1 else rows


def skipping_batches(
    images: list[Any], keys: list[Key], size: int, inputs: Callable[[list[Any]], Any]
) -> Iterator[tuple[Key, list[int], Any]]:
    """``(key, image indices, encoder inputs)`` of each decode call, leaving out (with a :class:`SkippedImageWarning`)
    every image that cannot be loaded or preprocessed; each image is decoded from its file or bytes once."""
    from edgecap.runtime.images.load import ImageError, load_image

    def skip(index: int, exc: ImageError) -> None:
        warnings.warn(SkippedImageWarning(index, images[index], exc), stacklevel=_caller_level())

    loaded: dict[int, Any] = {}
    for i, image in enumerate(images):
        try:
            loaded[i] = load_image(image)  # preprocessing takes the RGB image as is
        except ImageError as exc:
            skip(i, exc)
    for key, chunk in plan({i: keys[i] for i in loaded}, size):
        try:
            prepared = inputs([loaded[i] for i in chunk])
        except ImageError:  # one of them fails in preprocessing: find it, keep the rest
            kept = []
            for i in chunk:
                try:
                    inputs([loaded[i]])
                    kept.append(i)
                except ImageError as exc:
                    skip(i, exc)
            if not kept:
                continue
            chunk, prepared = kept, inputs([loaded[i] for i in kept])
        yield key, chunk, prepared


def _caller_level() -> int:
    """``warnings.warn``'s stacklevel for the first frame outside the captioner: the caller of ``caption``/``batch``."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__") in _OWN_MODULES:
        frame, level = frame.f_back, level + 1
    return level
