"""What the bench reads off an opened bundle to label a measurement: where its timed region starts and which trained
weights it holds."""

from __future__ import annotations

from typing import Any

__all__ = ["bundle_input_kind", "bundle_run_id"]


def bundle_input_kind(bundle: Any) -> str:
    """``"pixels"`` when the bundle captions images (a backbone in the graph or in its spec), else ``"features"``."""
    return "pixels" if bundle.backbone_in_graph or bundle.backbone_spec else "features"


def bundle_run_id(bundle: Any) -> str:
    """What identifies the trained weights behind a bundle: the captioner weights' and the backbone weights'
    SHA-256. Two bundles exported from the same run share it whether the backbone is in the graph or in torch, which
    is how a report pairs a pixels-in bundle with its torch-backbone twin."""
    files = bundle.manifest.get("files", {})
    weights = (files.get(bundle.config.get("weights", "weights.safetensors")) or {}).get("sha256") or "?"
    backbone = ((bundle.backbone_spec or {}).get("weights") or {}).get("sha256") or "none"
    return f"{weights[:16]}+{backbone[:16]}"
