"""The calibration-free INT8 schemes of a graph role, with ONNX Runtime's own quantisers.

A decoder step at batch 1 reads every weight once per token, so what it costs is the bytes of its weights and the
number of kernels it launches, not the arithmetic. Static QDQ (``int8.py``) stores INT8 weights, but ONNX
Runtime's CPU provider runs it as ``DequantizeLinear`` + ``MatMulIntegerToFloat`` pairs with the activations
quantised by calibrated scales. Two schemes need no calibration at all:

- ``dynamic``: ``quantize_dynamic`` (QOperator): INT8 per-channel weights in ``MatMulInteger``, activations quantised
  per call by ``DynamicQuantizeLinear`` (uint8, asymmetric; the preset's ``reduce_range`` keeps 7-bit weights on x86
  without VNNI). Standard ONNX ops (opset 10/11), run by ONNX Runtime's CPU integer GEMM kernels.
- ``weight-only``: ``MatMulNBitsQuantizer``: weights in 4 or 8 bits with one scale per ``block_size`` values along K,
  in the ``com.microsoft`` ``MatMulNBits`` op; with ``accuracy_level`` 4 its kernel quantises the activations to
  INT8 per block and multiplies in integers.

Both quantise only ``MatMul`` nodes whose second input is a constant weight; attention's activation × activation
matmuls and any node the caller excludes stay float. Neither ONNX Runtime quantiser takes ``Gemm`` (the exporter
writes a captioner's output projection as ``Gemm(x, Wᵀ, b)``, on acort-xsmall the largest weight of the step), so a
``Gemm`` with a constant weight is first rewritten as ``MatMul(x, W) + b`` (:func:`gemm_to_matmul`).
"""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgecap.workshop.export.calibration.onnxruntime_utils import quiet_logging
from edgecap.workshop.export.calibration.presets import QuantPreset, RolePolicy
from edgecap.workshop.export.calibration.source import CalibrationError

__all__ = [
    "INTEGER_MATMULS",
    "float_weight_matmuls",
    "gemm_to_matmul",
    "quantize_uncalibrated",
    "restore_float_weights",
    "scheme_summary",
]

#: The ops each scheme turns a weight ``MatMul`` into (static: a ``MatMul`` fed by ``DequantizeLinear``).
INTEGER_MATMULS = {"dynamic": ("MatMulInteger", "DynamicQuantizeLinear"), "weight-only": ("MatMulNBits",)}


def _constants(model: Any) -> set[str]:
    names = {t.name for t in model.graph.initializer}
    names.update(o for n in model.graph.node if n.op_type == "Constant" for o in n.output)
    return names


def _attribute(node: Any, name: str, default: Any) -> Any:
    import onnx

    found = [a for a in node.attribute if a.name == name]
    return onnx.helper.get_attribute_value(found[0]) if found else default


def gemm_to_matmul(model: Any, keep: Sequence[str] = ()) -> int:
    """Rewrite, in place, each ``Gemm`` with a constant weight, ``alpha = beta = 1`` and no ``transA`` as
    ``MatMul(A, B)`` (+ ``Add(C)``), with ``B`` stored as (K, N) (transposed once when ``transB``); the ``MatMul``
    keeps the ``Gemm``'s name, so exclusions by name still apply. Nodes named in ``keep`` are left alone. Returns how
    many were rewritten."""
    import onnx
    from onnx import numpy_helper

    weights = {t.name: t for t in model.graph.initializer}
    rewritten = 0
    nodes = []
    for node in model.graph.node:
        plain = (
            node.op_type == "Gemm"
            and node.name not in keep
            and len(node.input) > 1
            and node.input[1] in weights
            and _attribute(node, "alpha", 1.0) == 1.0
            and _attribute(node, "beta", 1.0) == 1.0
            and not _attribute(node, "transA", 0)
        )
        if not plain:
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(weights[node.input[1]])
        name = node.input[1] + ("_kn" if _attribute(node, "transB", 0) else "")
        if name not in weights:
            kn = weight.T.copy() if _attribute(node, "transB", 0) else weight
            weights[name] = numpy_helper.from_array(kn, name)
            model.graph.initializer.append(weights[name])
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        product = f"{node.output[0]}_matmul" if bias else node.output[0]
        nodes.append(onnx.helper.make_node("MatMul", [node.input[0], name], [product], name=node.name))
        if bias:
            nodes.append(onnx.helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}_bias"))
        rewritten += 1
    if rewritten:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        used = {i for n in model.graph.node for i in n.input}
        for tensor in [t for t in model.graph.initializer if t.name not in used]:
            model.graph.initializer.remove(tensor)
    return rewritten


def restore_float_weights(model: Any, original: Any, names: Sequence[str]) -> int:
    """Give the nodes named in ``names`` their float constant weights back; returns how many inputs were restored.

    With cross-layer parameter sharing (ACORT), one weight initialiser feeds several ``MatMul`` nodes;
    ``quantize_dynamic`` quantises it for the first and rewires every reader to a ``DequantizeLinear`` of the same
    name, so an excluded node would silently multiply by fake-quantised weights. The float copy is added as
    ``<weight>_float``.
    """
    wanted = set(names)
    weights = {t.name: t for t in original.graph.initializer}
    before = {n.name: n for n in original.graph.node if n.name in wanted}
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    have = {t.name for t in model.graph.initializer}
    restored = 0
    for node in model.graph.node:
        old = before.get(node.name)
        if old is None or len(old.input) != len(node.input):
            continue
        for k, name in enumerate(node.input):
            if producer.get(name) != "DequantizeLinear" or old.input[k] not in weights:
                continue
            copy = f"{old.input[k]}_float"
            if copy not in have:
                tensor = type(weights[old.input[k]])()
                tensor.CopyFrom(weights[old.input[k]])
                tensor.name = copy
                model.graph.initializer.append(tensor)
                have.add(copy)
            node.input[k] = copy
            restored += 1
    if restored:
        _drop_unused(model)
    return restored


def _drop_unused(model: Any) -> None:
    """Remove nodes none of whose outputs is read (a ``DequantizeLinear`` left without readers by
    :func:`restore_float_weights`) and initialisers nothing reads, until none is left."""
    outputs = {o.name for o in model.graph.output}
    while True:
        read = outputs | {i for n in model.graph.node for i in n.input}
        dead = [n for n in model.graph.node if not any(o in read for o in n.output if o)]
        if not dead:
            break
        for node in dead:
            model.graph.node.remove(node)
    read = outputs | {i for n in model.graph.node for i in n.input}
    for tensor in [t for t in model.graph.initializer if t.name not in read]:
        model.graph.initializer.remove(tensor)


def float_weight_matmuls(model: Any) -> list[str]:
    """Names of ``MatMul``/``Gemm`` nodes that still multiply by a float constant weight (what a non-static scheme
    should have left none of, exclusions apart)."""
    constants = _constants(model)
    return sorted(
        n.name or n.output[0]
        for n in model.graph.node
        if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] in constants
    )


def scheme_summary(model: Any, policy: RolePolicy) -> dict[str, Any]:
    """The ops a non-static scheme put in ``model`` (for the calibration report and the manifest)."""
    counts = Counter(n.op_type for n in model.graph.node)
    ops = {op: counts[op] for op in INTEGER_MATMULS[policy.scheme] if counts[op]}
    return {
        **policy.describe(),
        "quantized_ops": ops,
        "float_weight_matmuls": len(float_weight_matmuls(model)),
        "domains": sorted({n.domain or "ai.onnx" for n in model.graph.node}),
    }


def _dynamic(model_path: Path, out_path: Path, preset: QuantPreset, exclude: Sequence[str]) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    weight_type = QuantType.QInt8 if preset.weight_type == "int8" else QuantType.QUInt8
    quantize_dynamic(
        str(model_path),
        str(out_path),
        op_types_to_quantize=["MatMul"],
        per_channel=preset.per_channel,
        reduce_range=preset.reduce_range,
        weight_type=weight_type,
        nodes_to_exclude=list(exclude),
        extra_options={"MatMulConstBOnly": True},
    )


def _weight_only(model: Any, policy: RolePolicy, preset: QuantPreset, exclude: Sequence[str]) -> Any:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        model,
        bits=policy.bits,
        block_size=policy.block_size,
        is_symmetric=preset.weight_symmetric,
        accuracy_level=policy.accuracy_level,
        nodes_to_exclude=list(exclude),
        op_types_to_quantize=("MatMul",),
    )
    quantizer.process()
    return quantizer.model.model


def quantize_uncalibrated(
    model: Any, preset: QuantPreset, policy: RolePolicy, role: str, tmp: Path, exclude: Sequence[str]
) -> Any:
    """``model`` (pre-processed FP32) quantised with ``policy.scheme`` (``dynamic`` or ``weight-only``).

    Args:
        model: the FP32 graph after ``quant_pre_process``.
        preset: weight type, per-channel and ``reduce_range`` of the ``dynamic`` scheme; weight symmetry of both.
        policy: the role's scheme, bits and block options.
        role: the graph role, for errors.
        tmp: a scratch folder (``quantize_dynamic`` reads and writes files).
        exclude: node names kept float (the caller's exclusions and attention's activation matmuls).

    Raises:
        CalibrationError: onnxruntime failing, or no weight ``MatMul`` quantised.
    """
    import onnx

    model = onnx.ModelProto.FromString(model.SerializeToString())
    # Every plain Gemm becomes MatMul (+ Add) under its own name, excluded ones too: quantize_dynamic rewrites Gemms
    # itself under new names, which its nodes_to_exclude would no longer match; an excluded one stays a float MatMul.
    gemm_to_matmul(model)
    try:
        with quiet_logging(), contextlib.redirect_stdout(io.StringIO()):
            if policy.scheme == "dynamic":
                source, out = tmp / "pre-dynamic.onnx", tmp / "dynamic.onnx"
                onnx.save(model, str(source))
                _dynamic(source, out, preset, exclude)
                quantized = onnx.load(str(out))
            elif policy.scheme == "weight-only":
                quantized = _weight_only(model, policy, preset, exclude)
            else:
                raise CalibrationError(f"{role}: quantize_uncalibrated does not run the {policy.scheme!r} scheme")
    except CalibrationError:
        raise
    except Exception as exc:  # onnxruntime raises ValueError, AssertionError, NotImplementedError …
        raise CalibrationError(f"{role}: onnxruntime {policy.scheme} quantisation failed: {exc}") from exc
    restore_float_weights(quantized, model, exclude)
    produced = Counter(n.op_type for n in quantized.graph.node)
    if not produced[INTEGER_MATMULS[policy.scheme][0]]:
        raise CalibrationError(
            f"{role}: the {policy.scheme!r} scheme quantised nothing (no MatMul with a constant 2-D weight)"
        )
    return quantized
