"""Float16 ONNX graphs: float16 weights and compute, float32 inputs/outputs, float32 islands where parity needs them.

Precision lives in the graph (TensorRT 11 builds strongly typed networks only), so the same
file runs on TensorRT 10/11 and ONNX Runtime CUDA. The conversion is onnxconverter-common's
``convert_float_to_float16(keep_io_types=True)`` with two additions:

- its graph-output bug (a graph output that is also consumed inside the graph, or is a graph input passed through,
  gets the wrong type and the model fails to load) is avoided by routing every such output through its own
  ``Identity`` first;
- the block list comes from the spec's :class:`~edgecap.workshop.export.spec.Fp16Policy`: op types (normalisation,
  softmax, exp/log, sin/cos) plus the forward cone of chosen float32 inputs up to the first learned projection.

On x86 CPUs float16 graphs run *slower* than float32 (ONNX Runtime inserts casts around kernels it lacks); they are
GPU/NPU artefacts, tested here for correctness only.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Collection

import onnx
from onnx import ModelProto

from edgecap.workshop.export.graph import GraphError, unique_node_names
from edgecap.workshop.export.spec import Fp16Policy

__all__ = [
    "ALWAYS_FP32_OPS",
    "convert_to_fp16",
    "drop_cast_round_trips",
    "fp32_ancestor_nodes",
    "fp32_cone_nodes",
    "float_casts",
    "isolate_graph_outputs",
]

#: Ops the converter mishandles, kept float32 whatever the policy: it leaves ``ConstantOfShape``'s float32 ``value``
#: attribute as it is while typing the output float16, which the checker rejects.
ALWAYS_FP32_OPS = ("ConstantOfShape",)


def isolate_graph_outputs(model: ModelProto, kept_fp32: Collection[str] = ()) -> int:
    """Route graph outputs through their own ``Identity`` where onnxconverter-common's ``keep_io_types`` mistypes
    them: outputs also read inside the graph, and outputs produced by a node kept float32 (named in ``kept_fp32``,
    e.g. an empty cache from ``ConstantOfShape``), which would otherwise be left float16.

    Afterwards every such output is produced by a float16 ``Identity`` no other node reads, which the converter casts
    back to float32 correctly. Returns the number of outputs rewired.

    Raises:
        GraphError: an output that *is* a graph input (no node produces it).
    """
    graph = model.graph
    consumed = {name for node in graph.node for name in node.input}
    inputs = {vi.name for vi in graph.input}
    changed = 0
    producer = {o: node for node in graph.node for o in node.output}
    for out in graph.output:
        if out.name in inputs:
            raise GraphError(f"graph output {out.name!r} is also a graph input; give the output its own name")
        made_fp32 = out.name in producer and producer[out.name].name in kept_fp32
        if out.name not in consumed and not made_fp32:
            continue
        inner = f"{out.name}__value"
        for node in graph.node:
            node.output[:] = [inner if o == out.name else o for o in node.output]
            node.input[:] = [inner if i == out.name else i for i in node.input]
        for vi in graph.value_info:
            if vi.name == out.name:
                vi.name = inner
        graph.node.append(onnx.helper.make_node("Identity", [inner], [out.name], name=f"{out.name}__isolate"))
        changed += 1
    return changed


def fp32_cone_nodes(model: ModelProto, inputs: tuple[str, ...], stops: tuple[str, ...]) -> list[str]:
    """Names of nodes reachable from graph ``inputs`` without passing through an op in ``stops``."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_inputs = {vi.name for vi in model.graph.input}
    unknown = [n for n in inputs if n not in graph_inputs]
    if unknown:
        return []  # this variant of the graph does not take those inputs (e.g. a backbone bundle has no boxes)
    seen: set[str] = set()
    pending = list(inputs)
    names: list[str] = []
    while pending:
        tensor = pending.pop()
        for node in consumers.get(tensor, []):
            if node.op_type in stops or node.name in seen:
                continue
            seen.add(node.name)
            names.append(node.name)
            pending.extend(node.output)
    return names


def _float32_tensors(model: ModelProto) -> set[str]:
    graph = model.graph
    infos = (*graph.input, *graph.value_info, *graph.output)
    names = {vi.name for vi in infos if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    return names | {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}


def _cast_to(node: onnx.NodeProto) -> int | None:
    if node.op_type != "Cast":
        return None
    return next((a.i for a in node.attribute if a.name == "to"), None)


def drop_cast_round_trips(model: ModelProto) -> int:
    """Replace ``Cast(float32 -> float16) -> Cast(-> float32)`` chains by the original float32 tensor.

    The converter casts every float input to float16 at the graph boundary and casts back in front of each blocked
    node, so a float32 island fed by a graph input (e.g. ``boxes`` into the box embedding) would still see
    float16-rounded values: with centre offsets of 1e-3 that rounding alone moves the embedding's angles by tens of
    radians. The round trip only loses information, so reading the float32 source is strictly more accurate.
    Returns the number of casts bypassed.
    """
    graph = model.graph
    float32 = _float32_tensors(model)
    producer = {out: node for node in graph.node for out in node.output}
    graph_outputs = {vi.name for vi in graph.output}
    replace: dict[str, str] = {}
    for node in graph.node:
        if _cast_to(node) != onnx.TensorProto.FLOAT or node.output[0] in graph_outputs:
            continue
        first = producer.get(node.input[0])
        if first is not None and _cast_to(first) == onnx.TensorProto.FLOAT16 and first.input[0] in float32:
            replace[node.output[0]] = first.input[0]
    if not replace:
        return 0
    for node in graph.node:
        node.input[:] = [replace.get(name, name) for name in node.input]
    while True:  # drop casts left without readers (the bypassed pair, then what fed it)
        used = {name for node in graph.node for name in node.input} | graph_outputs
        keep = [n for n in graph.node if n.op_type != "Cast" or any(o in used for o in n.output)]
        if len(keep) == len(graph.node):
            return len(replace)
        del graph.node[:]
        graph.node.extend(keep)


def fp32_ancestor_nodes(model: ModelProto, op_types: tuple[str, ...], stops: tuple[str, ...]) -> list[str]:
    """Names of nodes of type ``op_types`` and of every node computing their inputs, walking back to graph inputs,
    constants, or a node in ``stops`` (excluded). ``Shape`` nodes are included but not walked through: their input's
    values do not matter, only its shape (otherwise a constant box grid expanded to the batch would pull in the
    whole backbone)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    seen: set[str] = set()
    names: list[str] = []
    pending = [node for node in model.graph.node if node.op_type in op_types]
    while pending:
        node = pending.pop()
        if node.name in seen or node.op_type in stops:
            continue
        seen.add(node.name)
        names.append(node.name)
        if node.op_type == "Shape":
            continue
        pending.extend(producer[name] for name in node.input if name in producer)
    return names


def float_casts(model: ModelProto) -> list[str]:
    """Names of the ``Cast`` nodes whose target is float32 (e.g. a bool mask turned into 0/1 weights).

    The converter types their outputs float16 but leaves their ``to`` attribute float32, which the checker rejects;
    kept float32 they get a float16 cast after them instead. (Putting ``Cast`` in the op block list instead makes the
    converter loop forever over the casts it inserts.)"""
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in n.attribute)
    ]


def convert_to_fp16(model: ModelProto, policy: Fp16Policy) -> ModelProto:
    """A float16 copy of ``model`` with float32 inputs/outputs and ``policy``'s float32 islands.

    Raises:
        GraphError: onnxconverter-common is missing or the conversion fails.
    """
    try:
        from onnxconverter_common import float16
    except ImportError as exc:
        raise GraphError("float16 export needs onnxconverter-common (pip install 'edgecap[train,cpu]')") from exc
    model = copy.deepcopy(model)
    unique_node_names(model)
    blocked = set(float16.DEFAULT_OP_BLOCK_LIST) | set(ALWAYS_FP32_OPS) | set(policy.op_types)
    keep_nodes = fp32_cone_nodes(model, policy.fp32_input_cones, policy.cone_stops)
    keep_nodes += fp32_ancestor_nodes(model, policy.fp32_ancestors_of, policy.cone_stops)
    keep_nodes += float_casts(model)
    kept = set(keep_nodes) | {n.name for n in model.graph.node if n.op_type in blocked}
    isolate_graph_outputs(model, kept)
    # Value infos computed for float32 would contradict the converted graph; the converter re-infers them.
    del model.graph.value_info[:]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one "will be truncated" warning per clamped initializer value
            converted = float16.convert_float_to_float16(
                model, keep_io_types=True, op_block_list=sorted(blocked), node_block_list=keep_nodes
            )
    except Exception as exc:  # the converter raises assorted types (KeyError, ValueError, RuntimeError)
        raise GraphError(f"float16 conversion failed: {exc}") from exc
    drop_cast_round_trips(converted)
    return converted
