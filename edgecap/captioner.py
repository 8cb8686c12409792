"""The embedded API: images in, captions out, from a trained run.

from edgecap.captioner import Captioner
cap = Captioner.from_run("acort-xsmall")      # a run directory or a model name trained earlier
print(cap("photo.jpg"))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from edgecap.captioning import caption_visual, decode_cfg_for
from edgecap.training.batches import VisualBatch


class BackboneMismatchError(ValueError):
    """The backbone available now is not the one the run's features were made with."""


def backbone_from_spec(spec: dict[str, Any], weights: str | Path | None = None):
    """Rebuild the backbone a feature cache (and so a run) was made with, and prove it is the same one."""
    from edgecap.models.backbone import create_backbone

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
    backbone = create_backbone(
        spec["name"], pretrained=source == "packaged", weights=weights, image_size=int(spec["image_size"])
    )
    got = backbone.spec["weights"].get("sha256")
    if got != identity.get("sha256"):
        raise BackboneMismatchError(
            f"backbone weights differ from the ones the run was trained with (sha256 {got} != {identity.get('sha256')})"
        )
    return backbone


class Captioner:
    """Backbone + captioner + decoding config; call it on one image or a list of images."""

    def __init__(self, backbone: Any, step_model: Any, vocab: Any, decode_cfg: Any, device: torch.device | str):
        self.backbone = backbone.to(device).eval()
        self.step_model = step_model
        self.vocab = vocab
        self.decode_cfg = decode_cfg
        self.device = torch.device(device)

    @classmethod
    def from_run(
        cls, run: str | Path, device: str = "cpu", beam: int = 3, backbone_weights: str | Path | None = None
    ) -> Captioner:
        from edgecap.runs import load_run
        from edgecap.runtimes.torch import TorchStepModel

        trained = load_run(run, device=device)
        backbone = backbone_from_spec(trained.backbone_spec, weights=backbone_weights)
        cfg = decode_cfg_for(trained.vocab, beam_size=beam, max_words=trained.max_words)
        return cls(backbone, TorchStepModel(trained.model, device=device), trained.vocab, cfg, device)

    def __call__(self, image: Any) -> str:
        return self.batch([image])[0]

    @torch.inference_mode()
    def batch(self, images: Sequence[Any], batch_size: int = 16) -> list[str]:
        """Captions for ``images`` (paths, PIL images or arrays), in order."""
        out: list[str] = []
        for start in range(0, len(images), batch_size):
            pixels = self.backbone.preprocess(list(images[start : start + batch_size])).to(self.device)
            features, boxes = self.backbone(pixels)
            mask = torch.ones(features.shape[:2], dtype=torch.bool, device=self.device)
            out.extend(caption_visual(self.step_model, VisualBatch(features, boxes, mask), self.vocab, self.decode_cfg))
        return out
