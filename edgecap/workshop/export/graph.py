"""ONNX graph utilities that need only ``onnx``: validation, portability checks, composition and metadata.

Kept apart from the exporter (``edgecap.workshop.export.onnx``) so that the float16 converter, parity checks and later
the bundle writer can use them on graphs loaded from disk.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import onnx
from onnx import ModelProto, NodeProto

__all__ = [
    "CONTROL_FLOW_OPS",
    "GraphError",
    "check_model",
    "compose_models",
    "count_ops",
    "get_metadata",
    "non_portable_nodes",
    "set_metadata",
    "unique_node_names",
]

#: Ops TensorRT cannot take as a network with outputs inside (as optimum's merged If-branch decoder showed).
CONTROL_FLOW_OPS = ("If", "Loop", "Scan")
#: Domains every backend understands: the ONNX standard domain (``""`` and its alias ``ai.onnx``).
STANDARD_DOMAINS = ("", "ai.onnx")


class GraphError(ValueError):
    """An ONNX graph that fails validation, cannot be composed, or is not portable; the message names it."""


def check_model(model: ModelProto, what: str) -> ModelProto:
    """``onnx.checker`` (full check, including strict shape inference) and shape inference.

    Returns the model with inferred ``value_info`` (what the float16 converter and TensorRT's parser rely on).

    Raises:
        GraphError: the checker or shape inference rejects the model; the message names ``what``.
    """
    try:
        onnx.checker.check_model(model, full_check=True)
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise GraphError(f"{what}: invalid ONNX graph: {exc}") from exc


def non_portable_nodes(model: ModelProto) -> list[str]:
    """Nodes a TensorRT-bound graph must not contain: control flow (``If``/``Loop``/``Scan``) and ops outside the
    standard ONNX domain (``com.microsoft`` fusions from ONNX Runtime's optimiser, custom ops). Empty when portable."""
    bad = []
    for node in _all_nodes(model.graph):
        if node.op_type in CONTROL_FLOW_OPS or node.domain not in STANDARD_DOMAINS:
            bad.append(f"{node.name or '<unnamed>'} ({node.domain or 'ai.onnx'}::{node.op_type})")
    for function in model.functions:
        bad.append(f"local function {function.domain}::{function.name}")
    return bad


def _all_nodes(graph: onnx.GraphProto) -> Iterable[NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)
            for sub in attr.graphs:
                yield from _all_nodes(sub)


def count_ops(model: ModelProto) -> dict[str, int]:
    """``op_type -> count`` over the whole graph (for reports)."""
    counts: dict[str, int] = {}
    for node in _all_nodes(model.graph):
        key = node.op_type if node.domain in STANDARD_DOMAINS else f"{node.domain}::{node.op_type}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def set_metadata(model: ModelProto, props: Mapping[str, Any]) -> None:
    """Set ``metadata_props`` entries (values as strings), replacing existing keys."""
    existing = {p.key: p.value for p in model.metadata_props}
    existing.update({str(k): str(v) for k, v in props.items()})
    del model.metadata_props[:]
    for key, value in existing.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value


def get_metadata(model: ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def unique_node_names(model: ModelProto, prefix: str = "node") -> None:
    """Give every top-level node a unique non-empty name (the float16 converter's block list is by node name)."""
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{prefix}_{node.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        node.name = name
        seen.add(name)


def _graph_tensor_names(graph: onnx.GraphProto) -> set[str]:
    names = {i.name for i in graph.input} | {o.name for o in graph.output} | {t.name for t in graph.initializer}
    for node in graph.node:
        names.update(n for n in node.input if n)
        names.update(n for n in node.output if n)
    return names


def compose_models(
    parts: Sequence[tuple[str, ModelProto]], inputs: Sequence[str], outputs: Sequence[str], what: str
) -> ModelProto:
    """Wire graphs into one: each part's inputs bind by name to the composite's ``inputs`` or to an earlier part's
    outputs; the composite exposes ``outputs`` (each produced by some part).

    Internal tensor, initializer and node names are prefixed with ``"<part>/"`` so that parts exported separately
    (whose initializer names may coincide) cannot collide; interface names stay as they are. Used to build the
    runtime's ``init`` graph (encoder + start) from the two graphs export already produced and checked, without
    tracing the model a third time.

    Raises:
        GraphError: an unbound part input, two parts producing one name, control flow or mismatched opsets.
    """
    if not parts:
        raise GraphError(f"{what}: nothing to compose")
    first = parts[0][1]
    opsets: dict[str, int] = {}
    available: dict[str, onnx.ValueInfoProto] = {}
    graph = onnx.GraphProto(name=what)
    for name in inputs:
        found = next((vi for _, m in parts for vi in m.graph.input if vi.name == name), None)
        if found is None:
            raise GraphError(f"{what}: composite input {name!r} is not an input of any part")
        graph.input.append(copy.deepcopy(found))
        available[name] = found
    for part_name, model in parts:
        for imp in model.opset_import:
            if opsets.setdefault(imp.domain, imp.version) != imp.version:
                raise GraphError(f"{what}: part {part_name!r} uses opset {imp.version} of domain {imp.domain!r}")
        if model.functions or any(n.op_type in CONTROL_FLOW_OPS for n in model.graph.node):
            raise GraphError(f"{what}: part {part_name!r} has local functions or control flow; cannot compose")
        g = model.graph
        interface = {vi.name for vi in g.input} | {vi.name for vi in g.output}
        unbound = [vi.name for vi in g.input if vi.name not in available]
        if unbound:
            raise GraphError(
                f"{what}: part {part_name!r} input(s) {unbound} are neither composite inputs nor earlier outputs"
            )
        clash = [vi.name for vi in g.output if vi.name in available]
        if clash:
            raise GraphError(f"{what}: part {part_name!r} output(s) {clash} are already defined")
        rename = {n: f"{part_name}/{n}" for n in _graph_tensor_names(g) - interface}
        for tensor in g.initializer:
            t = copy.deepcopy(tensor)
            t.name = rename.get(t.name, t.name)
            graph.initializer.append(t)
        for node in g.node:
            n = copy.deepcopy(node)
            n.name = f"{part_name}/{n.name}" if n.name else ""
            n.input[:] = [rename.get(x, x) for x in n.input]
            n.output[:] = [rename.get(x, x) for x in n.output]
            graph.node.append(n)
        for vi in g.value_info:
            v = copy.deepcopy(vi)
            v.name = rename.get(v.name, v.name)
            graph.value_info.append(v)
        for vi in g.output:
            available[vi.name] = vi
    for name in outputs:
        if name not in available or name in inputs:
            raise GraphError(f"{what}: composite output {name!r} is not produced by any part")
        graph.output.append(copy.deepcopy(available[name]))
    used_outputs = set(outputs)
    for _, model in parts[:-1]:
        for vi in model.graph.output:  # intermediate interface tensors (e.g. memory) keep their type info
            if vi.name not in used_outputs:
                graph.value_info.append(copy.deepcopy(vi))
    composite = onnx.helper.make_model(
        graph,
        opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()],
        ir_version=first.ir_version,
        producer_name=first.producer_name,
        producer_version=first.producer_version,
    )
    return composite
