"""LaBERT's ``encode`` + ``refine`` in torch as a :class:`~edgecap.runtime.decoding.mask_predict.RefineModel`, and
the metadata its exported graphs carry for the runtime adapter (:mod:`edgecap.runtime.backends.refine`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from edgecap.runtime.backends.refine import CAPTION_INPUTS
from edgecap.runtime.decoding.protocol import DecodeInputError, State
from edgecap.workshop.torch_runtime.runtime import as_torch, host_float32, resolve_device

__all__ = ["TorchRefineModel", "refine_metadata"]


def refine_metadata(model: Any) -> dict[str, str]:
    """What a runtime adapter needs besides the graphs, as graph metadata strings."""
    cfg = model.cfg
    return {
        "length_levels": json.dumps([list(p) for p in cfg.levels]),
        "refine_steps": json.dumps(list(cfg.refine_steps)),
        "eos_decay": json.dumps(list(cfg.eos_decay)),
        "mask_id": str(model.mask_id),
    }


class TorchRefineModel:
    """A ``LaBertCaptioner`` as a :class:`RefineModel` (eval mode, ``torch.inference_mode``): numpy or torch inputs,
    numpy tokens/levels moved to the device, float32 numpy log-probs back."""

    def __init__(self, model: Any, device: Any = "cpu") -> None:
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        cfg = model.cfg
        self.length_levels = tuple(cfg.levels)
        self.refine_steps = tuple(cfg.refine_steps)
        self.eos_decay = tuple(cfg.eos_decay)
        self.mask_id = int(model.mask_id)

    def encode(self, inputs: Mapping[str, Any]) -> State:
        unknown = [n for n in inputs if n not in CAPTION_INPUTS]
        if unknown or "features" not in inputs or "boxes" not in inputs:
            raise DecodeInputError(
                f"TorchRefineModel.encode: inputs need 'features', 'boxes' (+ optional 'feature_mask'); "
                f"got {sorted(inputs)}"
            )
        mask = inputs.get("feature_mask")
        with torch.inference_mode():
            return self.model.encode(
                as_torch(inputs["features"]).to(self.device),
                as_torch(inputs["boxes"]).to(self.device),
                None if mask is None else as_torch(mask).to(self.device),
            )

    def refine(self, tokens: np.ndarray, length_level: np.ndarray, state: State) -> np.ndarray:
        """tokens (B, L), length_level (B,): int64 numpy (torch accepted) -> (B, L, V) float32 numpy log-probs."""
        with torch.inference_mode():
            out = self.model.refine(
                as_torch(tokens).to(self.device, torch.long), as_torch(length_level).to(self.device, torch.long), state
            )
        return host_float32(out)
