"""The ``QuantizeLinear``/``DequantizeLinear`` pairs of a QDQ graph: what they quantise, and where they must not go.

- :func:`qdq_summary`: the per-op-type count of quantised nodes and of Q/DQ nodes, for the calibration report.
- :func:`restore_float_inputs`: undoes onnxruntime's rewiring of float consumers (excluded nodes, ``Shape``) to
  dequantised tensors, then drops the Q/DQ nodes and initialisers left unused (:func:`drop_dead_nodes`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["QDQ_OPS", "drop_dead_nodes", "qdq_summary", "restore_float_inputs"]

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def qdq_summary(model: Any, op_types: Iterable[str]) -> dict[str, Any]:
    """Counts of Q/DQ nodes and of quantised nodes per op type (nodes of ``op_types`` fed by a
    ``DequantizeLinear``; other ops reading a dequantised tensor, e.g. a ``Relu`` after a ``Conv``, still run float)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    wanted = set(op_types)
    quantised: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type not in wanted:
            continue
        if any(producer.get(i) is not None and producer[i].op_type == "DequantizeLinear" for i in node.input):
            quantised[node.op_type] = quantised.get(node.op_type, 0) + 1
    counts = {op: sum(1 for n in model.graph.node if n.op_type == op) for op in QDQ_OPS}
    return {
        "quantized_ops": dict(sorted(quantised.items())),
        "quantize_linear": counts[QDQ_OPS[0]],
        "dequantize_linear": counts[QDQ_OPS[1]],
    }


def restore_float_inputs(model: Any, original: Any, targets: set[str]) -> int:
    """Give the nodes named in ``targets`` and every ``Shape`` node their original float inputs back; returns how
    many inputs were restored.

    ONNX Runtime's QDQ quantiser rewires *every* consumer of a quantised tensor to the ``DequantizeLinear`` output:
    an excluded ``MatMul`` sharing its input (or, with cross-layer parameter sharing, its weight) with a quantised
    one would silently run on fake-quantised values, and a ``Shape`` would read a dequantised tensor. Nodes keep
    their names through quantisation, so the original inputs come from the pre-processed FP32 graph; a shared
    weight then exists once as float and once as INT8. Other consumers keep ONNX Runtime's placement (e.g. the
    ``Relu`` after a quantised ``Conv`` output, which lets it fuse ``QLinearConv`` chains). Unused Q/DQ nodes are
    removed.
    """
    before = {n.name: n for n in original.graph.node if n.name}
    producer = {o: n for n in model.graph.node for o in n.output}
    have = {t.name for t in model.graph.initializer}
    float_weights = {t.name: t for t in original.graph.initializer}
    restored = 0
    for node in model.graph.node:
        old = before.get(node.name)
        if old is None or not (node.name in targets or node.op_type == "Shape") or len(old.input) != len(node.input):
            continue
        for k, name in enumerate(node.input):
            source = producer.get(name)
            if source is None or source.op_type != "DequantizeLinear" or old.input[k] == name:
                continue
            node.input[k] = old.input[k]
            if old.input[k] in float_weights and old.input[k] not in have:
                model.graph.initializer.append(float_weights[old.input[k]])
                have.add(old.input[k])
            restored += 1
    drop_dead_nodes(model)
    return restored


def drop_dead_nodes(model: Any) -> None:
    """Remove Q/DQ nodes whose outputs nobody reads, then initialisers nobody reads."""
    while True:
        used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
        dead = [n for n in model.graph.node if n.op_type in QDQ_OPS and not any(o in used for o in n.output)]
        if not dead:
            break
        for node in dead:
            model.graph.node.remove(node)
    inputs = {i.name for i in model.graph.input}
    unused = [t for t in model.graph.initializer if t.name not in used and t.name not in inputs]
    for tensor in unused:
        model.graph.initializer.remove(tensor)
