"""Images -> encoder inputs for a bundle: Pillow + numpy preprocessing for pixels-in bundles, or the torch backbone
rebuilt from the bundle's spec for bundles whose encoder takes backbone features.

:class:`PixelInputs` is the edge path. The torch backbone (``BackboneInputs``, ``backbone_from_spec``) lives in
:mod:`edgecap.workshop.torch_runtime.images`, reached through :mod:`edgecap.runtime.torch_hooks` when such a bundle is
loaded on an install with torch.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgecap.runtime.torch_hooks import torch_available, torch_hook

if TYPE_CHECKING:
    from edgecap.runtime.bundle import Bundle

__all__ = ["BackboneMismatchError", "ImageInputs", "PixelInputs", "image_inputs"]

#: Images (paths, bytes or Pillow images) -> the encoder's named inputs (numpy arrays, or torch tensors from the
#: torch backbone): :class:`PixelInputs`, or the torch backbone of a features-in bundle.
ImageInputs = Callable[[Sequence[Any]], Mapping[str, Any]]


class BackboneMismatchError(ValueError):
    """The backbone available now is not the one the run's features were made with."""


class PixelInputs:
    """Images -> ``pixel_values`` (B, 3, S, S) float32 with the backbone's own preprocessing (decode, EXIF orientation,
    mode conversion, resize, crop, normalise in Pillow + numpy; see
    :class:`~edgecap.runtime.images.preprocess.PreprocessCfg`),
    for bundles whose encoder graph contains the backbone."""

    backbone = None

    def __init__(self, spec: Mapping[str, Any]) -> None:
        from edgecap.runtime.images.preprocess import PreprocessCfg

        self.cfg = PreprocessCfg.from_spec(spec)

    def __call__(self, images: Sequence[Any]) -> dict[str, np.ndarray]:
        return {"pixel_values": np.stack([self.cfg(image) for image in images]).astype(np.float32, copy=False)}


def image_inputs(bundle: Bundle, device: Any, in_graph: bool) -> tuple[ImageInputs | None, str, str]:
    """(images -> inputs, backbone description, reason images cannot be captioned) for a bundle.

    Args:
        bundle: an opened :class:`~edgecap.runtime.bundle.Bundle`.
        device: torch device of the backbone when it runs in torch (``in_graph=False``).
        in_graph: the encoder graph that will run takes pixels (the backbone is inside it).
    """
    spec = bundle.backbone_spec
    if not spec:
        return None, "none", (
            f"bundle {bundle.path} was exported from a run trained on precomputed region features: it captions "
            "features (Captioner.caption_inputs), not images"
        )  # fmt: skip
    if in_graph:
        return PixelInputs(spec), f"in the encoder graph ({spec['name']}, {spec['image_size']} px)", ""
    if not torch_available() or importlib.util.find_spec("timm") is None:
        return None, f"torch (not installed; {spec['name']})", (
            f"bundle {bundle.path} takes backbone features: captioning images runs its backbone in torch, which is "
            "not installed here (pip install 'edgecap[train]'); or re-export it pixels-in (the default of "
            "`edgecap export`), or caption precomputed features with Captioner.caption_inputs"
        )  # fmt: skip
    backbone_inputs = torch_hook("backbone_inputs")  # the backbone in torch (edgecap.runtime.torch_hooks)
    return (
        backbone_inputs(spec, bundle.backbone_weights, device),
        f"torch on {device} ({spec['name']}, {spec['image_size']} px)",
        "",
    )
