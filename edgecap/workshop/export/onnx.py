"""torch -> ONNX export driven by an :class:`~edgecap.workshop.export.spec.ExportSpec`.

Per graph: trace with the dynamo exporter (``dynamo=True``, ``external_data=False``, ``dynamic_shapes`` from the spec's
dims, example sizes >= 2: a size of 1 gets specialised and baked into reshapes) or compose already exported graphs; then
``onnx.checker`` + shape inference, simplification (onnxslim, or ONNX Runtime's *basic* offline optimiser, which adds no
``com.microsoft`` ops), a portability check (no ``If``/``Loop``/``Scan``, standard domain only, so the same file feeds
TensorRT), metadata (opset, edgecap version, model name, precision, graph role), the other precisions, and numeric
parity against torch on fresh inputs. Nothing here knows a model family: everything comes from the spec.

The steps live apart: tracing in :mod:`edgecap.workshop.export.tracing`, simplification, conversion and metadata in
:mod:`edgecap.workshop.export.finishing`, the results in :mod:`edgecap.workshop.export.results`; this module drives
them and still exports every name.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from onnx import ModelProto
from torch import nn

from edgecap.runtime._io import atomic_write_bytes, atomic_write_json
from edgecap.workshop.export.finishing import (
    PRECISION_CONVERTERS,
    SIMPLIFIERS,
    finalize_graph,
    simplify_model,
)
from edgecap.workshop.export.graph import GraphError, check_model, compose_models
from edgecap.workshop.export.results import ExportedGraph, ExportError, ExportResult
from edgecap.workshop.export.spec import ExportSpec, GraphSpec, get_export_spec
from edgecap.workshop.export.tracing import trace_graph

__all__ = [
    "SIMPLIFIERS",
    "ExportError",
    "ExportResult",
    "ExportedGraph",
    "export_onnx",
    "export_graph",
    "finalize_graph",
    "simplify_model",
    "trace_graph",
]

REPORT_NAME = "export_report.json"


def export_graph(
    spec: ExportSpec, graph: GraphSpec, exported: Mapping[str, ModelProto], opset: int | None = None
) -> ModelProto:
    """The raw fp32 graph: traced, or composed from ``exported`` fp32 graphs when ``graph.compose`` is set."""
    if graph.compose:
        missing = [p for p in graph.compose if p not in exported]
        if missing:
            raise ExportError(f"graph {graph.name!r} composes {missing}, which were not exported first")
        try:
            return compose_models(
                [(p, exported[p]) for p in graph.compose], graph.inputs, graph.outputs, f"{spec.name}/{graph.name}"
            )
        except GraphError as exc:
            raise ExportError(str(exc)) from exc
    return trace_graph(spec, graph, opset)


def export_onnx(
    model: nn.Module | None = None,
    out_dir: str | Path | None = None,
    *,
    spec: ExportSpec | None = None,
    backbone: nn.Module | None = None,
    name: str | None = None,
    graphs: Sequence[str] | None = None,
    precisions: Sequence[str] | None = None,
    simplify: str = "onnxslim",
    parity: bool = True,
    parity_seed: int = 1234,
    overwrite: bool = False,
) -> ExportResult:
    """Export a model's graphs to ONNX at each precision, with parity against torch.

    Args:
        model: a ``CaptionModel``; its spec comes from :func:`~edgecap.workshop.export.spec.get_export_spec`. Omit when
            ``spec`` is given.
        out_dir: write ``<precision>/<graph>.onnx`` and ``export_report.json`` here (atomically); None keeps the
            graphs in memory only.
        spec: an explicit spec (overrides ``model``/``backbone``/``name``).
        backbone: include this image backbone in the encoder graph (``pixel_values`` input).
        name: model name for the graphs' metadata.
        graphs: export only these graphs (plus what they compose); default all.
        precisions: default the spec's (``fp32`` and ``fp16``); ``fp32`` is always exported (the others derive from it).
        simplify: ``"onnxslim"``, ``"onnxruntime"`` (ONNX Runtime's basic-level offline optimiser) or
            ``"none"``.
        parity: run :func:`~edgecap.workshop.export.parity.check_graph` on every graph (fresh inputs, per-precision
        tolerances).
        parity_seed: seed of the parity inputs (independent of the export example inputs).
        overwrite: replace existing files in ``out_dir``.

    Returns:
        An :class:`ExportResult`; a failed parity check is recorded in it (``parity_passed``), not raised, so the
        caller decides (the CLI fails, a notebook can inspect the errors).
    """
    if spec is None:
        if model is None:
            raise ExportError("export_onnx needs a model or a spec")
        model.eval()
        if backbone is not None:
            backbone.eval()
        spec = get_export_spec(model, backbone=backbone, name=name)
    for graph in spec.graphs:  # dropout off before any dummy input is computed
        graph.module.eval()
    precisions = tuple(precisions or spec.precisions)
    unknown = [p for p in precisions if p != "fp32" and p not in PRECISION_CONVERTERS]
    if unknown:
        raise ExportError(f"unknown precision(s) {unknown}; known: ['fp32', *{sorted(PRECISION_CONVERTERS)}]")
    precisions = ("fp32", *(p for p in precisions if p != "fp32"))
    if simplify not in SIMPLIFIERS:
        raise ExportError(f"unknown simplifier {simplify!r}; choose one of {sorted(SIMPLIFIERS)}")
    selected = _with_dependencies(spec, graphs)
    if out_dir is not None:
        out_dir = Path(out_dir)
        clashes = [out_dir / p / f"{g}.onnx" for p in precisions for g in selected]
        existing = [str(p) for p in clashes if p.exists()]
        if existing and not overwrite:
            raise FileExistsError(f"export would overwrite {existing[:3]}; pass overwrite=True")

    raw: dict[str, ModelProto] = {}
    result = ExportResult(spec, {}, out_dir)
    for graph in spec.graphs:
        if graph.name not in selected:
            continue
        start = time.perf_counter()
        raw_model = export_graph(spec, graph, raw)
        raw[graph.name] = check_model(raw_model, f"{spec.name}/{graph.name}")
        traced_s = time.perf_counter() - start
        for precision in precisions:  # fp32 first: the other precisions convert the finished fp32 graph
            t0 = time.perf_counter()
            fp32 = result.graphs[(graph.name, "fp32")].model if precision != "fp32" else None
            final = finalize_graph(raw[graph.name], spec, graph, precision, simplify, fp32=fp32)
            entry = ExportedGraph(graph.name, precision, final, seconds=traced_s + time.perf_counter() - t0)
            traced_s = 0.0
            result.graphs[(graph.name, precision)] = entry
    if parity:
        from edgecap.workshop.export.parity import check_graph

        for entry in result.graphs.values():
            entry.parity = check_graph(spec, entry.name, entry.model, entry.precision, seed=parity_seed)
    if out_dir is not None:
        for entry in result.graphs.values():
            entry.path = out_dir / entry.precision / f"{entry.name}.onnx"
            atomic_write_bytes(entry.path, entry.serialized)
        atomic_write_json(out_dir / REPORT_NAME, result.report())
    return result


def _with_dependencies(spec: ExportSpec, graphs: Sequence[str] | None) -> set[str]:
    if graphs is None:
        return set(spec.graph_names)
    selected: set[str] = set()
    pending = list(graphs)
    while pending:
        graph = spec.graph(pending.pop())
        if graph.name not in selected:
            selected.add(graph.name)
            pending.extend(graph.compose)
    return selected
