"""The ONNX Runtime :class:`~edgecap.runtime.backends.refine.RuntimeRefineModel` of exported LaBERT graphs, its
length plan and mask id read from the refine graph's metadata."""

from __future__ import annotations

import json
import os
from typing import Any

from edgecap.runtime.backends.base import RuntimeInputError
from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeSession
from edgecap.runtime.backends.refine import RuntimeRefineModel

__all__ = ["create_onnxruntime_refine_model"]


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
    meta = _metadata(refine)
    needed = ("length_levels", "refine_steps", "eos_decay", "mask_id", "state_names")
    absent = [k for k in needed if k not in meta]
    if absent:
        raise RuntimeInputError(
            f"the refine graph's metadata lacks {absent}; re-export the bundle with `edgecap export`"
        )
    return RuntimeRefineModel(
        OnnxRuntimeSession(encoder, name="onnxruntime-encoder", role="encoder", **runtime_options),
        OnnxRuntimeSession(refine, name="onnxruntime-refine", role="refine", **runtime_options),
        meta["state_names"].split(","),
        length_levels=json.loads(meta["length_levels"]),
        refine_steps=json.loads(meta["refine_steps"]),
        eos_decay=json.loads(meta["eos_decay"]),
        mask_id=int(meta["mask_id"]),
    )
