"""Quantising one FP32 graph to INT8: :func:`quantize_graph` and its result, :class:`GraphInt8`.

A role whose preset policy is ``static`` is pre-processed (``quant_pre_process``), calibrated on the caller's feeds
and quantised to QDQ by ``quantize_static`` (``onnxruntime_utils``); the nodes the caller excludes and those the
policy keeps float (``graph_utils``) get their float inputs back afterwards (``qdq_utils``). A ``dynamic`` or
``weight-only`` role reads no feeds (``schemes``). Either way the graph gets edgecap's INT8 metadata and a JSON-ready
report; with a ``workdir`` the pre-processed and quantised graphs (and the ranges) are kept there.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from edgecap.runtime._io import atomic_write_bytes, atomic_write_json
from edgecap.workshop.export.calibration.calib_utils import Ranges, read_range_cache
from edgecap.workshop.export.calibration.graph_utils import (
    activation_matmuls,
    check_exclusions,
    graph_inputs,
    match_nodes,
    prune_opset_imports,
    unfused_activations,
)
from edgecap.workshop.export.calibration.onnxruntime_utils import (
    calibrate_and_quantize,
    import_quantization,
    preprocess,
)
from edgecap.workshop.export.calibration.presets import AUTO, HISTOGRAM_METHODS, QuantPreset, get_preset
from edgecap.workshop.export.calibration.qdq_utils import qdq_summary, restore_float_inputs
from edgecap.workshop.export.calibration.schemes import quantize_uncalibrated, scheme_summary
from edgecap.workshop.export.calibration.source import CalibrationError, CalibrationSource, as_source

__all__ = ["GraphInt8", "quantize_graph"]


@dataclasses.dataclass
class GraphInt8:
    """One graph quantised by :func:`quantize_graph`.

    Attributes:
        model: the QDQ ``onnx.ModelProto``.
        ranges: calibrated tensor -> (lowest, highest).
        info: JSON-ready report: role, method, feeds, cache use, quantised op counts, excluded nodes, pre-processing.
    """

    model: Any
    ranges: Ranges
    info: dict[str, Any]


def _prepared(
    model: Any, tmp: Path, role: str, exclude_nodes: Sequence[str], strict_exclusions: bool
) -> tuple[Any, str, list[str], list[str]]:
    """The graph after onnxruntime's quantisation pre-processing, how it was pre-processed, the node names that
    ``exclude_nodes`` (names or patterns) match in it and the patterns that match none (which raise when
    ``strict_exclusions``)."""
    pre_model, pre_mode = preprocess(model, tmp / "pre.onnx", role)
    matches = match_nodes(pre_model, list(exclude_nodes))
    unmatched = [p for p, names in matches.items() if not names]
    if strict_exclusions and unmatched:
        check_exclusions({role: pre_model}, unmatched)
    return pre_model, pre_mode, sorted({name for names in matches.values() for name in names}), unmatched


def quantize_graph(
    model: Any,
    feeds: CalibrationSource | Iterable[Mapping[str, Any]],
    preset: str | QuantPreset = AUTO,
    role: str = "step",
    *,
    exclude_nodes: Sequence[str] = (),
    exclude_op_types: Sequence[str] = (),
    strict_exclusions: bool = True,
    workdir: str | Path | None = None,
    progress: bool = False,
) -> GraphInt8:
    """Quantise one FP32 graph to INT8: QDQ calibrated on ``feeds``, or for a role whose scheme is ``dynamic`` /
    ``weight-only`` with ONNX Runtime's calibration-free quantisers (``feeds`` is not read; ranges come back empty).

    Args:
        model: the FP32 ``onnx.ModelProto`` (single file, no external data).
        feeds: calibration feeds, each with exactly the graph's inputs (cast to the declared dtypes). A
            :class:`CalibrationSource` with a ``cache`` path reuses the ONNX Runtime range cache there when it exists
            (no calibration pass, ``feeds`` is not iterated) and writes it otherwise.
        preset: a preset name (``cpu-auto`` resolves for this machine) or a :class:`QuantPreset`.
        role: graph role, selecting the preset's :class:`RolePolicy` (``"encoder"``, ``"step"``).
        exclude_nodes: node names or ``fnmatch`` globs kept float.
        exclude_op_types: op types removed from the role's quantised op types.
        strict_exclusions: raise when a pattern in ``exclude_nodes`` matches no node.
        workdir: also write ``<role>.fp32-pre.onnx``, ``<role>.int8.onnx`` and ``<role>.ranges.json`` here.
        progress: show a progress bar over the calibration feeds.

    Raises:
        CalibrationError: empty calibration set, feed names not matching the graph inputs, an unusable cache, nothing
            left to quantise, or onnxruntime failing.
    """
    from edgecap.workshop.export.graph import non_portable_nodes, set_metadata

    import_quantization()
    preset = get_preset(preset)
    base_policy = preset.role(role)
    op_types = tuple(op for op in base_policy.op_types if op not in set(exclude_op_types))
    if not op_types:
        raise CalibrationError(
            f"{role}: exclude_op_types {list(exclude_op_types)} leaves nothing to quantise "
            f"(policy: {list(base_policy.op_types)})"
        )
    fused = tuple(op for op in base_policy.fused_activations if op not in set(exclude_op_types))
    # an activation is only folded into a conv that is itself quantised
    policy = dataclasses.replace(base_policy, op_types=op_types, fused_activations=fused if "Conv" in op_types else ())
    if policy.scheme != "static":
        return _quantize_uncalibrated(model, preset, policy, role, exclude_nodes, strict_exclusions, workdir)
    source = as_source(feeds, f"{role} calibration feeds")
    cached = read_range_cache(source)
    length = source.length_hint()
    if policy.method in HISTOGRAM_METHODS and length is None and cached is None:
        # strided calibration needs the count: a one-shot iterator is kept in memory, a re-iterable one counted
        if source.reiterable:
            length = sum(1 for _ in source)
        else:
            source = source.materialize()
            length = len(source)

    with tempfile.TemporaryDirectory(prefix="edgecap-int8-") as tmp_name:
        tmp = Path(tmp_name)
        pre_model, pre_mode, excluded, unmatched = _prepared(model, tmp, role, exclude_nodes, strict_exclusions)
        float_matmuls = activation_matmuls(pre_model) if policy.weight_matmuls_only else []
        unfused = unfused_activations(pre_model, policy.fused_activations)
        qdq, ranges, onnxruntime_method, served = calibrate_and_quantize(
            tmp,
            preset,
            policy,
            role,
            source,
            graph_inputs(model),
            length,
            cached,
            sorted({*excluded, *float_matmuls, *unfused}),
            progress,
        )

    prune_opset_imports(qdq)
    restored = restore_float_inputs(qdq, pre_model, {*excluded, *float_matmuls, *unfused})
    summary = qdq_summary(qdq, op_types)
    if not summary["quantized_ops"]:
        raise CalibrationError(f"{role}: nothing was quantised (no {list(op_types)} node with quantisable inputs)")
    portable = not non_portable_nodes(qdq)
    if preset.standard_ops_only and not portable:
        raise CalibrationError(f"{role}: the QDQ graph has non-standard ops {non_portable_nodes(qdq)[:5]}")
    act = preset.activation_type + ("-symmetric" if preset.activation_symmetric else "")
    wt = preset.weight_type + ("-per-channel" if preset.per_channel else "") + ("-7bit" if preset.reduce_range else "")
    set_metadata(
        qdq,
        {
            "precision": "int8",
            "quant_format": "QDQ",
            "int8_preset": preset.name,
            "int8_activations": act,
            "int8_weights": wt,
            "calibration_method": policy.method,
            "calibration_feeds": served if cached is None else "cache",
        },
    )
    info = {
        "role": role,
        "method": policy.method,
        "onnxruntime_method": onnxruntime_method,
        "feeds": served,
        "cache": None if source.cache is None else {"path": str(source.cache), "reused": cached is not None},
        "op_types": list(op_types),
        "excluded_op_types": [op for op in base_policy.op_types if op not in op_types],
        "excluded_nodes": excluded,
        "unmatched_exclusions": unmatched,
        "float_activation_matmuls": len(float_matmuls),
        "float_inputs_restored": restored,
        **summary,
        "preprocess": pre_mode,
        "portable": portable,
        "calibrated_tensors": len(ranges),
        **policy.describe(),
    }
    if workdir is not None:
        wd = Path(workdir)
        atomic_write_bytes(wd / f"{role}.fp32-pre.onnx", pre_model.SerializeToString())
        atomic_write_bytes(wd / f"{role}.int8.onnx", qdq.SerializeToString())
        atomic_write_json(wd / f"{role}.ranges.json", {k: list(v) for k, v in ranges.items()})
    return GraphInt8(qdq, ranges, info)


def _quantize_uncalibrated(
    model: Any,
    preset: QuantPreset,
    policy: Any,
    role: str,
    exclude_nodes: Sequence[str],
    strict_exclusions: bool,
    workdir: str | Path | None,
) -> GraphInt8:
    """:func:`quantize_graph` for the ``dynamic`` and ``weight-only`` schemes
    (``edgecap.workshop.export.calibration.schemes``): no
    calibration feeds are read and no ranges come back."""
    from edgecap.workshop.export.graph import non_portable_nodes, set_metadata

    with tempfile.TemporaryDirectory(prefix="edgecap-int8-") as tmp_name:
        tmp = Path(tmp_name)
        pre_model, pre_mode, excluded, unmatched = _prepared(model, tmp, role, exclude_nodes, strict_exclusions)
        float_matmuls = activation_matmuls(pre_model)
        # weight matmuls of an op type the caller took out of the policy (``exclude_op_types``) stay float
        excluded_types = [
            n.name for n in pre_model.graph.node if n.op_type in ("MatMul", "Gemm") and n.op_type not in policy.op_types
        ]
        quantized = quantize_uncalibrated(
            pre_model, preset, policy, role, tmp, sorted({*excluded, *float_matmuls, *excluded_types})
        )
    prune_opset_imports(quantized)
    portable = not non_portable_nodes(quantized)
    if preset.standard_ops_only and not portable:
        raise CalibrationError(
            f"{role}: the {policy.scheme} graph has non-standard ops {non_portable_nodes(quantized)[:5]}"
        )
    summary = scheme_summary(quantized, policy)
    set_metadata(
        quantized,
        {
            "precision": "int8",
            "quant_format": "QOperator",
            "int8_preset": preset.name,
            "int8_scheme": policy.scheme,
            "int8_weights": f"{'int' if preset.weight_symmetric else 'uint'}{policy.bits}"
            + (f"-block{policy.block_size}" if policy.scheme == "weight-only" else "-per-channel"),
        },
    )
    info = {
        "role": role,
        "method": None,
        "feeds": 0,
        "op_types": [op for op in ("MatMul", "Gemm") if op in policy.op_types],
        "excluded_nodes": excluded,
        "unmatched_exclusions": unmatched,
        "float_activation_matmuls": len(float_matmuls),
        **summary,
        "preprocess": pre_mode,
        "portable": portable,
        "calibrated_tensors": 0,
    }
    if workdir is not None:
        wd = Path(workdir)
        atomic_write_bytes(wd / f"{role}.fp32-pre.onnx", pre_model.SerializeToString())
        atomic_write_bytes(wd / f"{role}.int8.onnx", quantized.SerializeToString())
    return GraphInt8(quantized, {}, info)
