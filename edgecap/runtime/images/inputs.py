"""Images -> encoder inputs for a bundle: Pillow + numpy preprocessing for pixels-in bundles, or the torch backbone
rebuilt from the bundle's spec for bundles whose encoder takes backbone features.

:class:`PixelInputs` is the edge path and imports no torch. :class:`BackboneInputs` and :func:`backbone_from_spec`
import torch and timm when they are used (the torch runtime, benchmarks, training runs).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["BackboneInputs", "BackboneMismatchError", "PixelInputs", "backbone_from_spec", "image_inputs"]


class BackboneMismatchError(ValueError):
    """The backbone available now is not the one the run's features were made with."""


class PixelInputs:
    """Images -> ``pixel_values`` (B, 3, S, S) float32 with the backbone's own preprocessing (decode, EXIF orientation,
    mode conversion, resize, crop, normalise in Pillow + numpy; see :class:`~edgecap.runtime.images.preprocess.PreprocessCfg`),
    for bundles whose encoder graph contains the backbone."""

    backbone = None

    def __init__(self, spec: Mapping[str, Any]) -> None:
        from edgecap.runtime.images.preprocess import PreprocessCfg

        self.cfg = PreprocessCfg.from_spec(spec)

    def __call__(self, images: Sequence[Any]) -> dict[str, np.ndarray]:
        return {"pixel_values": np.stack([self.cfg(image) for image in images]).astype(np.float32, copy=False)}


class BackboneInputs:
    """Images -> ``features`` (B, N, C), ``boxes`` (B, N, 4), ``feature_mask`` (B, N) through a torch backbone."""

    def __init__(self, backbone: Any, device: Any) -> None:
        import torch

        self.device = torch.device(device)
        self.backbone = backbone.to(self.device).eval()

    def __call__(self, images: Sequence[Any]) -> dict[str, Any]:
        import torch

        with torch.inference_mode():
            pixels = self.backbone.preprocess(list(images)).to(self.device)
            features, boxes = self.backbone(pixels)
            mask = torch.ones(features.shape[:2], dtype=torch.bool, device=self.device)
        return {"features": features, "boxes": boxes, "feature_mask": mask}


def backbone_from_spec(spec: Mapping[str, Any], weights: Any = None) -> Any:
    """Rebuild the backbone a feature cache (and so a run) was made with, and prove it is the same one."""
    if not spec:
        raise BackboneMismatchError(
            "the run records no backbone (it was trained on precomputed region features); "
            "captioning raw images needs a run trained on backbone features"
        )
    identity = spec.get("weights", {})
    source = identity.get("source")
    if weights is None and source == "file":
        raise BackboneMismatchError(
            f"the run's backbone used local weights {identity.get('file')!r}: pass that file (backbone_weights=...)"
        )
    if weights is None and source == "random":
        raise BackboneMismatchError(
            "the run's features came from a randomly initialised backbone, which cannot be rebuilt; "
            "extract features with pretrained or file weights to caption images"
        )
    from edgecap.build.models.backbone import create_backbone
    from edgecap.runtime.images.preprocess import PreprocessCfg

    # The recorded preprocessing, not the timm weights' default: an imported run records the official one.
    preprocess = None
    if all(key in spec for key in PreprocessCfg.SPEC_FIELDS):
        preprocess = PreprocessCfg.from_spec(spec)
    backbone = create_backbone(
        spec["name"],
        pretrained=source == "packaged",
        weights=weights,
        image_size=int(spec["image_size"]),
        preprocess=preprocess,
    )
    got = backbone.spec["weights"].get("sha256")
    if got != identity.get("sha256"):
        raise BackboneMismatchError(
            f"backbone weights differ from the ones the run was trained with (sha256 {got} != {identity.get('sha256')})"
        )
    return backbone


def image_inputs(bundle: Any, device: Any, in_graph: bool) -> tuple[Any, str, str]:
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
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("timm") is None:
        return None, f"torch (not installed; {spec['name']})", (
            f"bundle {bundle.path} takes backbone features: captioning images runs its backbone in torch, which is "
            "not installed here (pip install 'edgecap[train]'); or re-export it pixels-in (the default of "
            "`edgecap export`), or caption precomputed features with Captioner.caption_inputs"
        )  # fmt: skip
    backbone = backbone_from_spec(spec, weights=bundle.backbone_weights)
    return BackboneInputs(backbone, device), f"torch on {device} ({spec['name']}, {spec['image_size']} px)", ""
