"""Images -> backbone features in torch: the backbone a run's features were made with, rebuilt and proven the same.

Bundles whose encoder graph takes backbone features (exported with ``--backbone-outside``), training runs
(:meth:`edgecap.Captioner.from_run`), SCST and end-to-end fine-tuning rebuild their backbone here from the spec
recorded with the features.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from edgecap.runtime.images.inputs import BackboneMismatchError
from edgecap.runtime.images.preprocess import PreprocessCfg
from edgecap.workshop.models.backbone import create_backbone

__all__ = ["BackboneInputs", "backbone_from_spec", "backbone_inputs"]


class BackboneInputs:
    """Images -> ``features`` (B, N, C), ``boxes`` (B, N, 4), ``feature_mask`` (B, N) through a torch backbone."""

    def __init__(self, backbone: Any, device: Any) -> None:
        self.device = torch.device(device)
        self.backbone = backbone.to(self.device).eval()

    def __call__(self, images: Sequence[Any]) -> dict[str, Any]:
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


def backbone_inputs(spec: Mapping[str, Any], weights: Any, device: Any) -> BackboneInputs:
    """Images -> features through the backbone of ``spec`` (a bundle's ``backbone`` section), on ``device``."""
    return BackboneInputs(backbone_from_spec(spec, weights=weights), device)
