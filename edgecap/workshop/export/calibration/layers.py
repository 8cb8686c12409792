"""The quantised *layers* of a QDQ graph, and the graph with some of them back in float.

Accuracy-aware INT8 (``sensitivity``) keeps whole layers in float, not single ONNX nodes: a layer is the group of
quantised nodes (``MatMul``/``Gemm``/``Conv`` fed by a ``DequantizeLinear``) that run one torch module's weight. The
dynamo exporter names nodes by op (``node_MatMul_30``) and folds a ``Linear``'s transposed weight into an anonymous
constant (``val_31``), so the module is found from the weight itself:

1. its bytes (or its transpose's) equal a parameter of the torch model the graph was exported from
   (:func:`param_index`);
2. else its initialiser name is a module path (``part.backbone.model.blocks.3.0.conv_pw.weight``: convolutions keep
   theirs, unless batch norm was folded into them);
3. else the node is its own layer.

A module run more than once (ACORT's cross-layer parameter sharing, Table 1) is one layer: every node reading that
weight goes float together, as the module it is.

:func:`with_float_layers` restores float inputs around chosen layers of the already-quantised graph
(``qdq_utils.restore_float_inputs``): no re-calibration, the other layers keep their calibrated ranges.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgecap.workshop.export.calibration.qdq_utils import drop_dead_nodes, restore_float_inputs

__all__ = ["QuantLayer", "param_index", "quantised_layers", "with_float_layers"]


@dataclass(frozen=True)
class QuantLayer:
    """One quantised layer: ``role`` (graph), ``name`` (module path or node name) and its node names."""

    role: str
    name: str
    nodes: tuple[str, ...]

    @property
    def key(self) -> str:
        """``role:name``, unique over a captioner's graphs."""
        return f"{self.role}:{self.name}"


def _digest(array: np.ndarray) -> str:
    data = np.ascontiguousarray(array, dtype=np.float32)
    return hashlib.sha1(repr(data.shape).encode() + data.tobytes()).hexdigest()


def param_index(named_params: Iterable[tuple[str, Any]]) -> dict[str, str]:
    """Digest of each parameter's values (and of its transpose, for 2-D ones) -> its module path.

    ``named_params``: ``(name, tensor or array)`` pairs, e.g. ``model.named_parameters()``; ``.weight``/``.bias`` is
    dropped from the name. The first name wins for tied parameters."""
    index: dict[str, str] = {}
    for name, value in named_params:
        array = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        if array.dtype.kind != "f" or array.ndim < 1:
            continue
        module = name.rsplit(".", 1)[0] if name.rsplit(".", 1)[-1] in ("weight", "bias") else name
        index.setdefault(_digest(array), module)
        if array.ndim == 2:
            index.setdefault(_digest(array.T), module)
    return index


def _module_from_name(name: str) -> str | None:
    """``encoder/part.backbone.model.blocks.3.0.conv_pw.weight`` -> ``backbone.model.blocks.3.0.conv_pw``."""
    base = name.rsplit("/", 1)[-1]
    if not base.endswith(".weight"):
        return None
    module = base[: -len(".weight")]
    for prefix in ("part.", "model."):
        if module.startswith(prefix):
            module = module[len(prefix) :]
    return module or None


def quantised_layers(
    qdq: Any, original: Any, role: str, op_types: Sequence[str], params: Mapping[str, str] | None = None
) -> list[QuantLayer]:
    """The quantised layers of ``qdq`` (nodes of ``op_types`` reading a dequantised tensor), in graph order.

    Args:
        qdq: the QDQ graph.
        original: the FP32 graph it was quantised from, after ``quant_pre_process`` (same node names).
        role: the graph's runtime role (``encoder``, ``step``, ``refine``).
        op_types: the op types the role quantises.
        params: :func:`param_index` of the torch model, to name layers by module; None: names and nodes only.
    """
    from onnx import numpy_helper

    producer = {o: n for n in qdq.graph.node for o in n.output}
    weights = {t.name: t for t in original.graph.initializer}
    before = {n.name: n for n in original.graph.node if n.name}
    digests: dict[str, str] = {}
    groups: dict[str, list[str]] = {}
    wanted = set(op_types)
    for node in qdq.graph.node:
        if node.op_type not in wanted or node.name not in before:
            continue
        if not any(producer.get(i) is not None and producer[i].op_type == "DequantizeLinear" for i in node.input):
            continue
        name = None
        for tensor in (i for i in before[node.name].input if i in weights):
            if params:
                if tensor not in digests:
                    digests[tensor] = _digest(numpy_helper.to_array(weights[tensor]))
                name = params.get(digests[tensor])
            name = name or _module_from_name(tensor)
            if name:
                break
        groups.setdefault(name or node.name, []).append(node.name)
    return [QuantLayer(role, name, tuple(nodes)) for name, nodes in groups.items()]


def with_float_layers(qdq: Any, original: Any, layers: Iterable[QuantLayer]) -> Any:
    """A copy of ``qdq`` whose ``layers`` read their original float inputs (the Q/DQ pairs only they used are
    dropped); ``qdq`` is left as it is."""
    nodes = {n for layer in layers for n in layer.nodes}
    out = copy.deepcopy(qdq)
    if nodes:
        restore_float_inputs(out, original, nodes)
        _restore_same_name_weights(out, original, nodes)
        rewired = _drop_orphan_pairs(out)
        _restore_fused_activations(out, original, nodes | rewired)
        drop_dead_nodes(out)
    return out


def _restore_same_name_weights(model: Any, original: Any, targets: set[str]) -> None:
    """Replace the ``DequantizeLinear`` that feeds a float layer a weight under the weight's own name (ONNX Runtime
    quantises a ``Conv`` bias to int32 and dequantises it to the original name, which ``restore_float_inputs`` cannot
    tell from the float tensor) by the float initialiser: otherwise the bias is dequantised on every call and the
    float conv cannot be pre-packed (it ran slower than FP32)."""
    weights = {t.name: t for t in original.graph.initializer}
    have = {t.name for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    drop = []
    for node in model.graph.node:
        if node.name not in targets:
            continue
        for name in node.input:
            dq = producer.get(name)
            if dq is not None and dq.op_type == "DequantizeLinear" and name in weights and name not in have:
                drop.append(dq)
                model.graph.initializer.append(weights[name])
                have.add(name)
    for dq in drop:
        model.graph.node.remove(dq)


#: Op types whose Q/DQ inputs make them integer ops (the presets quantise these; the rest only read DQ outputs).
QUANTISED_OPS = ("MatMul", "Gemm", "Conv")


def _drop_orphan_pairs(model: Any) -> set[str]:
    """Rewire to the float tensor every reader of an activation's ``Q -> DQ`` pair that no integer op reads any more,
    and return the rewired nodes' names.

    ONNX Runtime hands a quantised tensor's DQ output to *every* consumer (a residual ``Add``, a ``LayerNorm``), so
    once the layers that needed the pair are float, those consumers would still see rounded values: with every layer
    float the graph would not be FP32."""
    producer = {o: n for n in model.graph.node for o in n.output}
    readers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}
    rewired: set[str] = set()
    for dq in [n for n in model.graph.node if n.op_type == "DequantizeLinear"]:
        q = producer.get(dq.input[0])
        if q is None or q.op_type != "QuantizeLinear" or dq.output[0] in outputs:
            continue
        users = readers.get(dq.output[0], [])
        if not users or any(u.op_type in QUANTISED_OPS for u in users):
            continue
        for user in users:
            for k, name in enumerate(user.input):
                if name == dq.output[0]:
                    user.input[k] = q.input[0]
            rewired.add(user.name)
    return rewired


def _restore_fused_activations(model: Any, original: Any, targets: set[str]) -> None:
    """Put back the activation a float layer's input went through in FP32.

    A preset with ``fused_activations`` lets ONNX Runtime drop the ``Relu``/``Clip`` after a quantised ``Conv``: the
    conv's output takes the activation's name and its Q/DQ range does the clamping. A layer restored to float then
    reads that tensor *unclamped* (EfficientNet-Lite's ReLU6 gone), so the activation is re-inserted in front of it.
    """
    producer = {o: n for n in model.graph.node for o in n.output}
    before = {o: n for n in original.graph.node for o in n.output}
    have = {t.name for t in model.graph.initializer}
    weights = {t.name: t for t in original.graph.initializer}
    added: dict[str, str] = {}
    for index, node in reversed(list(enumerate(model.graph.node))):
        if node.name not in targets:
            continue
        for k, name in enumerate(node.input):
            fp32 = before.get(name)
            now = producer.get(name)
            if fp32 is None or now is None or fp32.op_type not in ("Relu", "Clip") or now.op_type == fp32.op_type:
                continue
            if name not in added:
                act = copy.deepcopy(fp32)
                act.name = f"{fp32.name}_float_layer"
                act.output[0] = added[name] = f"{name}_float_layer"
                act.input[0] = name
                for extra in list(act.input)[1:]:
                    if extra and extra in weights and extra not in have:
                        model.graph.initializer.append(weights[extra])
                        have.add(extra)
                model.graph.node.insert(index, act)
            node.input[k] = added[name]
