""":class:`~edgecap.runtime.decoding.mask_predict.RefineModel` adapters: LaBERT's ``encode`` + ``refine`` on torch and on any
graph :class:`~edgecap.runtime.backends.base.Runtime` (ONNX Runtime now, TensorRT later), so one mask-predict loop runs
everywhere — the non-autoregressive counterpart of ``TorchStepModel`` / ``RuntimeStepModel``.

Graph contract (``edgecap.build.export.specs.labert``): ``encoder`` (visual inputs -> ``visual``, ``visual_bias``) and
``refine`` (``tokens`` (B, L) int64, ``length_level`` (B,) int64, the state -> ``logprobs`` (B, L, V)). The length
levels, default T and γ per level and the ``[MASK]`` id travel in the graphs' metadata.

The mask-predict loop hands both adapters int64 numpy tokens and levels and reads numpy log-probs back. torch is
imported only by ``TorchRefineModel``: the ONNX Runtime path (``RuntimeRefineModel``) runs without it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgecap.runtime._renamed import renamed_getattr
from edgecap.runtime.backends.base import Array, Runtime, RuntimeInputError
from edgecap.runtime.backends.bridge import GraphPair
from edgecap.runtime.decoding.protocol import DecodeInputError, State

#: The visual inputs of a refine model's encoder (as ``edgecap.build.torch_runtime.runtime.CAPTION_INPUTS``).
CAPTION_INPUTS = ("features", "boxes", "feature_mask")

__all__ = ["RuntimeRefineModel", "TorchRefineModel", "create_onnxruntime_refine_model", "refine_metadata"]

#: Older names of public objects here ("ort" now names only the Object Relation Transformer family).
_RENAMED = {"create_ort_refine_model": "create_onnxruntime_refine_model"}
__getattr__ = renamed_getattr(__name__, _RENAMED)


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
        from edgecap.build.torch_runtime.runtime import resolve_device

        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        cfg = model.cfg
        self.length_levels = tuple(cfg.levels)
        self.refine_steps = tuple(cfg.refine_steps)
        self.eos_decay = tuple(cfg.eos_decay)
        self.mask_id = int(model.mask_id)

    def encode(self, inputs: Mapping[str, Any]) -> State:
        import torch

        from edgecap.build.torch_runtime.runtime import as_torch

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
        import torch

        from edgecap.build.torch_runtime.runtime import as_torch, host_float32

        with torch.inference_mode():
            out = self.model.refine(
                as_torch(tokens).to(self.device, torch.long), as_torch(length_level).to(self.device, torch.long), state
            )
        return host_float32(out)


class RuntimeRefineModel(GraphPair):
    """A :class:`RefineModel` over an encoder runtime and a refine runtime (a context manager, like
    :class:`~edgecap.runtime.backends.bridge.RuntimeStepModel`)."""

    def __init__(
        self,
        encoder: Runtime,
        refine: Runtime,
        state_names: Sequence[str],
        *,
        length_levels: Sequence[Sequence[int]],
        refine_steps: Sequence[int],
        eos_decay: Sequence[float],
        mask_id: int,
    ) -> None:
        super().__init__(encoder, refine, state_names)
        from edgecap.runtime.bundle.limits import check_length_plan  # a hostile 10^9 passes would never finish

        check_length_plan(length_levels, refine_steps, eos_decay, f"{refine.name}: length plan", RuntimeInputError)
        self.length_levels = tuple((int(lo), int(hi)) for lo, hi in length_levels)
        self.refine_steps = tuple(int(t) for t in refine_steps)
        self.eos_decay = tuple(float(g) for g in eos_decay)
        self.mask_id = int(mask_id)

    @property
    def refine_runtime(self) -> Runtime:
        """The refine runtime."""
        return self.loop_runtime

    def encode(self, inputs: Mapping[str, Any]) -> State:
        return self.run_encoder(inputs)

    def refine(self, tokens: np.ndarray, length_level: np.ndarray, state: State) -> np.ndarray:
        """tokens (B, L), length_level (B,) int64 numpy -> (B, L, V) float32 numpy log-probs."""
        meta = self.refine_runtime.input_metadata()
        feed: dict[str, Array] = {
            "tokens": self._loop_ops.feed(tokens, meta["tokens"].dtype),
            "length_level": self._loop_ops.feed(length_level, meta["length_level"].dtype),
        }
        feed.update((n, state[n]) for n in self.state_names)
        outputs = self.refine_runtime.infer(feed)
        if "logprobs" not in outputs:
            raise DecodeInputError(f"{self.refine_runtime.name}: outputs lack 'logprobs' (got {sorted(outputs)})")
        return self._loop_ops.logprobs(outputs["logprobs"])


def _metadata(model: Any) -> dict[str, str]:
    import onnx

    if isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    elif isinstance(model, (str, os.PathLike)):
        model = onnx.load(os.fspath(model), load_external_data=False)
    return {p.key: p.value for p in model.metadata_props}


def create_onnxruntime_refine_model(encoder: Any, refine: Any, **runtime_options: Any) -> RuntimeRefineModel:
    """A :class:`RuntimeRefineModel` over exported LaBERT ``encoder`` and ``refine`` graphs (paths, bytes or
    ``onnx.ModelProto``); levels, T, γ and the mask id are read from the refine graph's metadata.

    ``runtime_options`` go to both :class:`~edgecap.runtime.backends.onnxruntime.session.OnnxRuntimeSession` sessions
    (``intra_op_threads`` …).
    """
    from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeSession

    meta = _metadata(refine)
    needed = ("length_levels", "refine_steps", "eos_decay", "mask_id", "state_names")
    absent = [k for k in needed if k not in meta]
    if absent:
        raise RuntimeInputError(f"the refine graph's metadata lacks {absent}; export it with edgecap.build.export")
    return RuntimeRefineModel(
        OnnxRuntimeSession(encoder, name="onnxruntime-encoder", role="encoder", **runtime_options),
        OnnxRuntimeSession(refine, name="onnxruntime-refine", role="refine", **runtime_options),
        meta["state_names"].split(","),
        length_levels=json.loads(meta["length_levels"]),
        refine_steps=json.loads(meta["refine_steps"]),
        eos_decay=json.loads(meta["eos_decay"]),
        mask_id=int(meta["mask_id"]),
    )
