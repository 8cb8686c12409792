"""Image preprocessing that matches a backbone's pretrained weights, in PIL + numpy only.

Kept free of torch and timm so an edge script that runs ONNX graphs (``Captioner.load``) preprocesses images
exactly like training did without importing either.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from PIL import Image

from edgecap.runtime.images.load import ImageLike, load_image

__all__ = ["PreprocessCfg"]

_INTERPOLATIONS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


@dataclasses.dataclass(frozen=True)
class PreprocessCfg:
    """Evaluation preprocessing that matches a model's pretrained weights (timm's ``transforms_imagenet_eval``).

    ``center``: resize the shorter side to ``floor(S / crop_pct)``, centre-crop ``S``; ``squash``: resize both sides to
    ``floor(S / crop_pct)``, centre-crop; ``border``: fit the longer side, pad with the mean colour. Then ``/255`` and
    ``(x - mean) / std``. Implemented with PIL + numpy only so runtimes without torch/timm preprocess identically.
    """

    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bicubic"
    crop_pct: float = 0.875
    crop_mode: str = "center"

    def __post_init__(self) -> None:
        if self.interpolation not in _INTERPOLATIONS:
            raise ValueError(f"interpolation {self.interpolation!r} not one of {sorted(_INTERPOLATIONS)}")
        if self.crop_mode not in ("center", "squash", "border"):
            raise ValueError(f"crop_mode {self.crop_mode!r} not one of center/squash/border")
        if not 0.0 < self.crop_pct <= 2.0:
            raise ValueError(f"crop_pct must be in (0, 2], got {self.crop_pct}")
        if self.image_size < 16:
            raise ValueError(f"image_size must be >= 16, got {self.image_size}")

    #: The fields a bundle's or run's backbone spec records (``image_size`` besides).
    SPEC_FIELDS = ("mean", "std", "interpolation", "crop_pct", "crop_mode")

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> PreprocessCfg:
        """The preprocessing a backbone spec records (``image_size`` and :attr:`SPEC_FIELDS`)."""
        return cls(
            image_size=int(spec["image_size"]),
            mean=tuple(float(v) for v in spec["mean"]),
            std=tuple(float(v) for v in spec["std"]),
            interpolation=str(spec["interpolation"]),
            crop_pct=float(spec["crop_pct"]),
            crop_mode=str(spec["crop_mode"]),
        )

    @classmethod
    def from_timm(cls, pretrained_cfg: Mapping[str, Any], image_size: int) -> PreprocessCfg:
        """Read ``crop_pct``/``crop_mode``/``interpolation``/``mean``/``std`` from a timm ``pretrained_cfg``."""
        interpolation = pretrained_cfg.get("interpolation") or "bicubic"
        return cls(
            image_size=image_size,
            mean=tuple(float(v) for v in pretrained_cfg.get("mean", (0.485, 0.456, 0.406))),
            std=tuple(float(v) for v in pretrained_cfg.get("std", (0.229, 0.224, 0.225))),
            interpolation=interpolation if interpolation in _INTERPOLATIONS else "bicubic",
            crop_pct=float(pretrained_cfg.get("crop_pct") or 0.875),
            crop_mode=str(pretrained_cfg.get("crop_mode") or "center"),
        )

    def crop(self, image: Image.Image) -> Image.Image:
        """Resize and crop an RGB image to ``(S, S)``."""
        size, resample = self.image_size, _INTERPOLATIONS[self.interpolation]
        scale = math.floor(size / self.crop_pct)
        width, height = image.size
        if self.crop_mode == "squash":
            image = image.resize((scale, scale), resample)
            return _center_crop_or_pad(image, size, (0, 0, 0))
        if self.crop_mode == "border":
            ratio = max(width / scale, height / scale)
            image = image.resize((max(1, round(width / ratio)), max(1, round(height / ratio))), resample)
            return _center_crop_or_pad(image, size, tuple(round(255 * m) for m in self.mean))
        short, long = min(width, height), max(width, height)
        new_long = int(scale * long / short)
        new_size = (scale, new_long) if width <= height else (new_long, scale)
        if new_size != image.size:
            image = image.resize(new_size, resample)
        return _center_crop_or_pad(image, size, (0, 0, 0))

    def __call__(self, src: ImageLike) -> np.ndarray:
        """Load, crop and normalise one image → ``(3, S, S)`` float32."""
        pixels = np.asarray(self.crop(load_image(src)), dtype=np.float32) / np.float32(255.0)
        pixels = (pixels - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return np.ascontiguousarray(pixels.transpose(2, 0, 1))


def _center_crop_or_pad(image: Image.Image, size: int, fill: tuple[int, ...]) -> Image.Image:
    width, height = image.size
    if width < size or height < size:
        canvas = Image.new("RGB", (max(width, size), max(height, size)), fill)
        canvas.paste(image, ((canvas.width - width) // 2, (canvas.height - height) // 2))
        image, (width, height) = canvas, canvas.size
    # torchvision rounds half to even here (Python's round); match it so pixels equal timm's transform exactly.
    top, left = int(round((height - size) / 2.0)), int(round((width - size) / 2.0))
    return image.crop((left, top, left + size, top + size))
