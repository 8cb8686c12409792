"""Finishing an exported graph: check, shape inference, simplification (fp32) or conversion (other precisions),
the portability check (no ``If``/``Loop``/``Scan``, standard domain only, so the same file feeds TensorRT) and
metadata (opset, edgecap version, model name, precision, graph role).

Simplifiers: onnxslim, or ONNX Runtime's *basic* offline optimiser, which adds no ``com.microsoft`` ops.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import ModelProto

from edgecap._version import __version__
from edgecap.workshop.export.fp16 import convert_to_fp16
from edgecap.workshop.export.graph import GraphError, check_model, non_portable_nodes, set_metadata
from edgecap.workshop.export.results import ExportError
from edgecap.workshop.export.spec import ExportSpec, GraphSpec
from edgecap.workshop.export.tracing import _quiet_exporter


def _simplify_onnxslim(model: ModelProto) -> ModelProto:
    import onnxslim

    with _quiet_exporter():
        return onnxslim.slim(model)


def _simplify_onnxruntime(model: ModelProto) -> ModelProto:
    """ONNX Runtime's offline optimiser at the *basic* level: constant folding and redundant-node elimination only;
    the extended level would fuse into ``com.microsoft`` contrib ops that TensorRT cannot parse."""
    import tempfile

    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with tempfile.TemporaryDirectory() as tmp:
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


SIMPLIFIERS: dict[str, Callable[[ModelProto], ModelProto]] = {
    "onnxslim": _simplify_onnxslim,
    "onnxruntime": _simplify_onnxruntime,
    "none": lambda model: model,
}


def simplify_model(model: ModelProto, method: str, what: str) -> ModelProto:
    """Simplify with ``method`` (a key of :data:`SIMPLIFIERS`); the interface (names, dims) is preserved."""
    fn = SIMPLIFIERS.get(method)
    if fn is None:
        raise ExportError(f"unknown simplifier {method!r}; choose one of {sorted(SIMPLIFIERS)}")
    try:
        simplified = fn(model)
    except ImportError as exc:
        raise ExportError(
            f"{what}: simplifier {method!r} is not installed ({exc}); pip install 'edgecap[train,cpu]'"
        ) from exc
    before = ([i.name for i in model.graph.input], [o.name for o in model.graph.output])
    after = ([i.name for i in simplified.graph.input], [o.name for o in simplified.graph.output])
    if before != after:
        raise ExportError(f"{what}: simplifier {method!r} changed the graph interface {before} -> {after}")
    return simplified


def finalize_graph(
    model: ModelProto,
    spec: ExportSpec,
    graph: GraphSpec,
    precision: str,
    simplify: str = "onnxslim",
    fp32: ModelProto | None = None,
) -> ModelProto:
    """Check, infer shapes, simplify (fp32) or convert the finished fp32 graph (other precisions), re-check, verify
    portability and stamp metadata; raises :class:`ExportError`.

    Args:
        model: the raw traced/composed graph.
        fp32: the finished fp32 graph, which other precisions are converted from (finished here when None).
    """
    what = f"{spec.name}/{graph.name} ({precision})"
    try:
        if precision == "fp32":
            model = check_model(simplify_model(check_model(model, what), simplify, what), what)
        else:
            base = fp32 if fp32 is not None else finalize_graph(model, spec, graph, "fp32", simplify)
            converter = PRECISION_CONVERTERS.get(precision)
            if converter is None:
                raise ExportError(f"{what}: no converter for precision {precision!r}")
            model = check_model(converter(base, graph), what)
    except GraphError as exc:
        raise ExportError(str(exc)) from exc
    bad = non_portable_nodes(model)
    if bad:
        raise ExportError(f"{what}: graph is not portable to TensorRT: {bad[:10]}")
    opset = next((imp.version for imp in model.opset_import if imp.domain in ("", "ai.onnx")), spec.opset)
    model.doc_string = graph.description
    model.producer_name, model.producer_version = "edgecap", __version__
    set_metadata(
        model,
        {
            **spec.metadata,
            "edgecap_version": __version__,
            "model_name": spec.name,
            "graph_role": graph.name,
            "precision": precision,
            "opset": opset,
            "inputs": ",".join(graph.inputs),
            "outputs": ",".join(graph.outputs),
        },
    )
    return model


PRECISION_CONVERTERS: dict[str, Callable[[ModelProto, GraphSpec], ModelProto]] = {
    "fp16": lambda model, graph: convert_to_fp16(model, graph.fp16),
}
