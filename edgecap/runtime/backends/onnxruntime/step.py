"""The exported ``init`` + ``step`` graphs of an autoregressive captioner as a decoding ``StepModel`` on ONNX Runtime
(two :class:`~edgecap.runtime.backends.onnxruntime.session.OnnxRuntimeSession` sessions behind a
:class:`~edgecap.runtime.backends.bridge.RuntimeStepModel`), with the step graph's state names read from its metadata.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, cast

from edgecap.runtime.backends.bridge import RuntimeStepModel
from edgecap.runtime.backends.onnxruntime.session import ModelSource, OnnxRuntimeSession

__all__ = ["ModelSource", "create_onnxruntime_step_model"]


def create_onnxruntime_step_model(
    encoder: ModelSource,
    step: ModelSource,
    state_names: Sequence[str] | None = None,
    updated_state_names: Sequence[str] | None = None,
    *,
    decode_workers: int = 1,
    **runtime_options: Any,
) -> RuntimeStepModel:
    """A :class:`~edgecap.runtime.backends.bridge.RuntimeStepModel` over the exported ``init``
    (encoder + start) and ``step`` graphs, so ``edgecap.runtime.decoding.decode`` runs on ONNX Runtime unchanged.

    Args:
        encoder: the runtime encoder graph (``ExportResult.runtime_models()["encoder"]``, i.e. ``init.onnx``): decode
            inputs -> the initial state.
        step: the step graph: ``tokens`` + state -> ``logprobs`` + ``<state>_out``.
        state_names: state order; default read from the step graph's ``state_names`` metadata (written by export),
            else its inputs other than ``tokens``.
        updated_state_names: the states the step graph outputs; default read from its ``updated_state_names``
            metadata, else all.
        decode_workers: concurrent chunks a batch decodes in (``ThreadPlan.decode_workers``; 1 = one decode).
        **runtime_options: :class:`OnnxRuntimeSession` options for both sessions (``providers``,
            ``intra_op_threads`` …).

    Use it as a context manager (``with create_onnxruntime_step_model(...) as sm: decode(sm, inputs, cfg)``); both
    sessions are created once on entry.
    """
    if state_names is None or updated_state_names is None:
        meta_names, meta_updated = _state_names_of(step)
        state_names = meta_names if state_names is None else state_names
        updated_state_names = meta_updated if updated_state_names is None else updated_state_names
    return RuntimeStepModel(
        OnnxRuntimeSession(encoder, name="onnxruntime-encoder", role="encoder", **runtime_options),
        OnnxRuntimeSession(step, name="onnxruntime-step", role="step", **runtime_options),
        tuple(state_names),
        updated_state_names=updated_state_names,
        decode_workers=decode_workers,
    )


def _state_names_of(step: ModelSource) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """(state names, updated state names or None = all) from the step graph's metadata or its inputs."""
    try:
        import onnx
    except ImportError as exc:
        raise ImportError("reading state names from a graph needs onnx; pass state_names= instead") from exc
    model: Any = step if hasattr(step, "graph") else onnx.load_from_string(step) if isinstance(step, bytes) else None
    if model is None:
        model = onnx.load(os.fspath(cast("str | os.PathLike[str]", step)), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    updated = tuple(meta["updated_state_names"].split(",")) if meta.get("updated_state_names") else None
    if meta.get("state_names"):
        return tuple(meta["state_names"].split(",")), updated
    initializers = {t.name for t in model.graph.initializer}
    names = tuple(i.name for i in model.graph.input if i.name != "tokens" and i.name not in initializers)
    return names, updated
