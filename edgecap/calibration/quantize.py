"""Static INT8 quantisation of a captioner's runtime graphs to QDQ ONNX with ONNX Runtime's own quantiser.

:func:`quantize_int8` takes the FP32 runtime graphs (``{"encoder": init graph, "step": step graph}``), the caller's
encoder feeds (real images: backbone pixels or region features) and the deployed :class:`DecodeCfg`, then

1. decodes the calibration images with the FP32 graphs on ONNX Runtime, recording the step graph's feeds (tokens,
   cross-attention keys/values and the growing self-attention cache) — realistic decoder calibration data
   (``edgecap.calibration.record``);
2. per graph (:func:`quantize_graph`): ``quant_pre_process`` (symbolic shape inference, basic ORT optimisation,
   ONNX shape inference), then ``quantize_static(QuantFormat.QDQ)`` with the target preset's types, op types and
   calibration method (``edgecap.calibration.presets``), excluding the nodes/op types the caller names;
3. returns the QDQ graphs, the calibration tensor ranges (JSON-ready) and a calibration report for the bundle
   manifest. TensorRT builds from the QDQ graphs themselves (explicit INT8; ``edgecap engine``), so no TensorRT
   calibration table is written.

A length-controllable model (``*-len``, LaBERT §3.1: its encoder graph takes ``length_level``) is calibrated at every
level: feeds without levels get one per image, cycling over the plan, and each image is decoded at its own level.

Each feed is checked against the graph's inputs; an empty calibration set, a set from which decoding records no step
feed, or mismatching names raise :class:`~edgecap.calibration.source.CalibrationError` before any quantisation runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import inspect
import io
import json
import logging
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgecap._io import atomic_write_bytes, atomic_write_json
from edgecap._versions import InvalidVersion, parse_version
from edgecap.calibration.presets import AUTO, HISTOGRAM_METHODS, QuantPreset, get_preset
from edgecap.calibration.record import FeedRecorder, record_decoder_feeds
from edgecap.calibration.source import (
    CalibrationError,
    CalibrationSource,
    OrtCalibrationReader,
    as_source,
    check_feed_names,
)

__all__ = [
    "GraphInt8",
    "Int8Result",
    "graph_inputs",
    "quantize_graph",
    "quantize_int8",
]

#: Ranges of one graph: tensor name -> (lowest, highest) calibrated value.
Ranges = dict[str, tuple[float, float]]
_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
#: Memory bound of the recorded decoder feeds: at most this many hypotheses per step feed, and this many bytes in all.
#: A step row of acort-xsmall at 49 regions holds ~50 KB of cross-attention keys plus its cache, so 512 beam-search
#: feeds of 12 rows would need ~300 MB; 8 rows and 256 MiB keep calibration on a laptop.
DECODER_ROWS_PER_FEED = 8
DECODER_FEED_BYTES = 256 << 20


# -- onnxruntime plumbing --------------------------------------------------------------------------------------------
#: The oldest onnxruntime INT8 export is tested with (exported bundles run on >= 1.18).
MIN_QUANTIZE_ORT = (1, 32)


def _release(version: str) -> tuple[int, ...]:
    """``"1.32.0"`` / ``"1.18.1+cu12"`` / ``"1.33.0rc1"`` -> the release numbers (``(1, 32, 0)``): a nightly or
    local build of a release counts as that release; ``()`` for a string that is not a version."""
    try:
        return parse_version(version).release
    except InvalidVersion:
        return ()


def _ort_quantization() -> Any:
    try:
        import onnxruntime.quantization as ortq
    except ImportError as exc:
        raise ImportError("INT8 quantisation needs onnxruntime: pip install 'edgecap[cpu]' (or [gpu])") from exc
    import onnxruntime

    if _release(onnxruntime.__version__) < MIN_QUANTIZE_ORT:
        raise ImportError(
            f"INT8 export needs onnxruntime >= {'.'.join(map(str, MIN_QUANTIZE_ORT))} (installed: "
            f"{onnxruntime.__version__}; older quant_pre_process fails on graphs with external data, seen with 1.30); "
            "running bundles needs only >= 1.18: upgrade onnxruntime where you export"
        )
    if "calibration_cache_path" not in inspect.signature(ortq.quantize_static).parameters:
        raise ImportError(
            f"onnxruntime {onnxruntime.__version__} is too old: edgecap's INT8 path needs quantize_static("
            "calibration_cache_path=...) (onnxruntime PR #28221, May 2026; present in 1.32): upgrade onnxruntime"
        )
    return ortq


@contextlib.contextmanager
def _quiet_ort_logging() -> Iterator[None]:
    """Silence onnxruntime.quantization's root-logger warnings (one per int64 tensor it cannot quantise) without
    letting its ``logging.warning`` calls run ``basicConfig`` on an unconfigured root logger."""
    root = logging.getLogger()
    level, added = root.level, None
    if not root.handlers:
        added = logging.NullHandler()
        root.addHandler(added)
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
        if added is not None:
            root.removeHandler(added)


def graph_inputs(model: Any) -> dict[str, np.dtype]:
    """The feed inputs of an ONNX model (initialisers excluded), name -> numpy dtype, in graph order."""
    import onnx

    initializers = {t.name for t in model.graph.initializer}
    out: dict[str, np.dtype] = {}
    for vi in model.graph.input:
        if vi.name not in initializers:
            out[vi.name] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
    return out


def _preprocess(model: Any, path: Path, what: str) -> tuple[Any, str]:
    """``quant_pre_process`` into ``path``; symbolic shape inference with ``auto_merge`` first, without it on failure
    (the dynamo exporter's shapes are complete already). Returns the model and the mode used."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    attempts = (("symbolic+optimize", {"auto_merge": True}), ("optimize", {"skip_symbolic_shape": True}))
    errors = []
    for mode, options in attempts:
        try:
            with _quiet_ort_logging():
                quant_pre_process(model, str(path), **options)
            processed = onnx.load(str(path))
            break
        except Exception as exc:  # symbolic shape inference raises bare Exceptions
            errors.append(f"{mode}: {exc}")
    else:
        raise CalibrationError(f"{what}: quant_pre_process failed: {'; '.join(errors)}")
    before = [i.name for i in model.graph.input], [o.name for o in model.graph.output]
    after = [i.name for i in processed.graph.input], [o.name for o in processed.graph.output]
    if before != after:
        raise CalibrationError(f"{what}: pre-processing changed the graph interface {before} -> {after}")
    return processed, mode


# -- exclusions ------------------------------------------------------------------------------------------------------
def _split_role(item: str, roles: Iterable[str]) -> tuple[str | None, str]:
    """``"step:node_*"`` -> ``("step", "node_*")`` when ``step`` is a role; otherwise ``(None, item)``."""
    role, sep, rest = item.partition(":")
    return (role, rest) if sep and role in roles else (None, item)


def _for_role(items: Iterable[str], role: str, roles: Iterable[str]) -> list[str]:
    out = []
    for item in items:
        target, value = _split_role(item, roles)
        if target is None or target == role:
            out.append(value)
    return out


def _match_nodes(model: Any, patterns: Sequence[str]) -> dict[str, list[str]]:
    """pattern -> names of the nodes it matches (``fnmatch`` globs; an exact name is a glob too)."""
    names = [n.name for n in model.graph.node if n.name]
    return {p: [n for n in names if fnmatch.fnmatchcase(n, p)] for p in patterns}


def _check_exclusions(models: Mapping[str, Any], exclude_nodes: Sequence[str]) -> None:
    """Every exclusion pattern must match a node of some graph it targets: a typo must not silently do nothing."""
    roles = list(models)
    unmatched = []
    for item in exclude_nodes:
        target, pattern = _split_role(item, roles)
        targets = [target] if target is not None else roles
        if not any(_match_nodes(models[r], [pattern])[pattern] for r in targets):
            unmatched.append(item)
    if unmatched:
        sample = {
            r: [n.name for n in m.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")][:8] for r, m in models.items()
        }
        raise CalibrationError(
            f"exclude_nodes pattern(s) {unmatched} match no node of {sorted(roles)}; "
            f"node names look like {sample} (prefix a pattern with 'encoder:' or 'step:' to target one graph)"
        )


# -- graph inspection ------------------------------------------------------------------------------------------------
def _activation_matmuls(model: Any) -> list[str]:
    """Names of ``MatMul``/``Gemm`` nodes whose second operand is computed, not a weight (attention's Q·Kᵀ and
    weights·V): they stay float under ``RolePolicy.weight_matmuls_only``."""
    constants = {t.name for t in model.graph.initializer}
    constants.update(o for n in model.graph.node if n.op_type == "Constant" for o in n.output)
    return sorted(
        n.name
        for n in model.graph.node
        if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] not in constants
    )


def _unfused_activations(model: Any, fused: Iterable[str]) -> list[str]:
    """Names of ``RolePolicy.fused_activations`` nodes that do not directly follow a ``Conv``: they stay float (a
    ``Relu`` after a residual ``Add`` or in a transformer's feed-forward is not an integer conv's epilogue)."""
    wanted = set(fused)
    if not wanted:
        return []
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    after_conv = {n.name for n in model.graph.node if n.input and producers.get(n.input[0]) == "Conv"}
    return sorted(n.name for n in model.graph.node if n.op_type in wanted and n.name not in after_conv)


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
    counts = {op: sum(1 for n in model.graph.node if n.op_type == op) for op in _QDQ_OPS}
    return {
        "quantized_ops": dict(sorted(quantised.items())),
        "quantize_linear": counts[_QDQ_OPS[0]],
        "dequantize_linear": counts[_QDQ_OPS[1]],
    }


def _prune_opset_imports(model: Any) -> None:
    """Drop opset imports of domains no node uses (ORT's pre-processing and quantiser add ``com.microsoft``,
    ``ai.onnx.ml`` …), so the QDQ file declares only what it needs."""
    used = {n.domain for n in model.graph.node} | {"", "ai.onnx"}
    keep = [imp for imp in model.opset_import if imp.domain in used]
    if len(keep) != len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(keep)


def _restore_float_inputs(model: Any, original: Any, targets: set[str]) -> int:
    """Give the nodes named in ``targets`` and every ``Shape`` node their original float inputs back; returns how
    many inputs were restored.

    ONNX Runtime's QDQ quantiser rewires *every* consumer of a quantised tensor to the ``DequantizeLinear`` output:
    an excluded ``MatMul`` sharing its input (or, with cross-layer parameter sharing, its weight) with a quantised
    one would silently run on fake-quantised values, and a ``Shape`` would read a dequantised tensor. Nodes keep
    their names through quantisation, so the original inputs come from the pre-processed FP32 graph; a shared
    weight then exists once as float and once as INT8. Other consumers keep ORT's placement (e.g. the ``Relu`` after
    a quantised ``Conv`` output, which lets ORT fuse ``QLinearConv`` chains). Unused Q/DQ nodes are removed.
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
    _drop_dead_nodes(model)
    return restored


def _drop_dead_nodes(model: Any) -> None:
    """Remove Q/DQ nodes whose outputs nobody reads, then initialisers nobody reads."""
    while True:
        used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
        dead = [n for n in model.graph.node if n.op_type in _QDQ_OPS and not any(o in used for o in n.output)]
        if not dead:
            break
        for node in dead:
            model.graph.node.remove(node)
    inputs = {i.name for i in model.graph.input}
    unused = [t for t in model.graph.initializer if t.name not in used and t.name not in inputs]
    for tensor in unused:
        model.graph.initializer.remove(tensor)


def _ranges_from_cache(path: Path) -> tuple[Ranges, str]:
    from onnxruntime.quantization.calibrate import load_tensors_data

    data = load_tensors_data(path)
    ranges: Ranges = {}
    for name in data:
        lowest, highest = data[name].range_value
        ranges[name] = (float(np.min(lowest)), float(np.max(highest)))
    method = getattr(data.calibration_method, "name", str(data.calibration_method))
    return dict(sorted(ranges.items())), method


def _validate_ort_cache(source: CalibrationSource) -> bytes | None:
    data = source.read_cache()
    if data is None:
        return None
    try:
        parsed = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        parsed = None
    if not isinstance(parsed, dict) or "data" not in parsed or "calibration_method" not in parsed:
        raise CalibrationError(
            f"calibration cache {source.cache} is not an ONNX Runtime tensor-range cache (JSON with 'data' and "
            "'calibration_method'); a TensorRT calibration table cannot be reused here — delete it or use another path"
        )
    return data


# -- one graph -------------------------------------------------------------------------------------------------------
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
    pre_model, pre_mode = _preprocess(model, tmp / "pre.onnx", role)
    matches = _match_nodes(pre_model, list(exclude_nodes))
    unmatched = [p for p, names in matches.items() if not names]
    if strict_exclusions and unmatched:
        _check_exclusions({role: pre_model}, unmatched)
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
    from edgecap.export.graph import non_portable_nodes, set_metadata

    _ort_quantization()
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
    cached = _validate_ort_cache(source)
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
        activation_matmuls = _activation_matmuls(pre_model) if policy.weight_matmuls_only else []
        unfused = _unfused_activations(pre_model, policy.fused_activations)
        qdq, ranges, ort_method, served = _calibrate_and_quantize(
            tmp,
            preset,
            policy,
            role,
            source,
            graph_inputs(model),
            length,
            cached,
            sorted({*excluded, *activation_matmuls, *unfused}),
            progress,
        )

    _prune_opset_imports(qdq)
    restored = _restore_float_inputs(qdq, pre_model, {*excluded, *activation_matmuls, *unfused})
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
        "ort_method": ort_method,
        "feeds": served,
        "cache": None if source.cache is None else {"path": str(source.cache), "reused": cached is not None},
        "op_types": list(op_types),
        "excluded_op_types": [op for op in base_policy.op_types if op not in op_types],
        "excluded_nodes": excluded,
        "unmatched_exclusions": unmatched,
        "float_activation_matmuls": len(activation_matmuls),
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
    """:func:`quantize_graph` for the ``dynamic`` and ``weight-only`` schemes (``edgecap.calibration.schemes``): no
    calibration feeds are read and no ranges come back."""
    from edgecap.calibration.schemes import quantize_uncalibrated, scheme_summary
    from edgecap.export.graph import non_portable_nodes, set_metadata

    with tempfile.TemporaryDirectory(prefix="edgecap-int8-") as tmp_name:
        tmp = Path(tmp_name)
        pre_model, pre_mode, excluded, unmatched = _prepared(model, tmp, role, exclude_nodes, strict_exclusions)
        activation_matmuls = _activation_matmuls(pre_model)
        # weight matmuls of an op type the caller took out of the policy (``exclude_op_types``) stay float
        excluded_types = [
            n.name for n in pre_model.graph.node if n.op_type in ("MatMul", "Gemm") and n.op_type not in policy.op_types
        ]
        quantized = quantize_uncalibrated(
            pre_model, preset, policy, role, tmp, sorted({*excluded, *activation_matmuls, *excluded_types})
        )
    _prune_opset_imports(quantized)
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
        "float_activation_matmuls": len(activation_matmuls),
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


def _calibrate_and_quantize(
    tmp: Path,
    preset: QuantPreset,
    policy: Any,
    role: str,
    source: CalibrationSource,
    inputs: Mapping[str, np.dtype],
    length: int | None,
    cached: bytes | None,
    nodes_to_exclude: list[str],
    progress: bool,
) -> tuple[Any, Ranges, str, int]:
    """``quantize_static`` on ``tmp/pre.onnx`` with the range cache in ``tmp``; returns the QDQ model, the ranges,
    ORT's name of the calibration method and the number of feeds read (0 when the cache was reused)."""
    import onnx

    ortq = _ort_quantization()
    cache_path = tmp / "ranges.json"
    if cached is not None:
        cache_path.write_bytes(cached)
    bar = _progress_bar(progress, length, f"int8 {role}: calibrating ({policy.method})")
    reader = OrtCalibrationReader(source, list(inputs), inputs, length=length, on_feed=bar.update if bar else None)
    kwargs = preset.quantize_kwargs(policy)
    if policy.method in HISTOGRAM_METHODS:
        # one feed per collect pass: bounded memory, and ORT's histogram collector cannot stack feeds of different
        # shapes (it raises "inhomogeneous shape"; MinMax accepts them)
        kwargs["extra_options"]["CalibStridedMinMax"] = 1
    out_path = tmp / "int8.onnx"
    try:
        with _quiet_ort_logging(), contextlib.redirect_stdout(io.StringIO()):
            ortq.quantize_static(
                str(tmp / "pre.onnx"),
                str(out_path),
                reader,
                nodes_to_exclude=nodes_to_exclude,
                calibration_providers=["CPUExecutionProvider"],
                calibration_cache_path=str(cache_path),
                **kwargs,
            )
    except CalibrationError:
        raise
    except Exception as exc:  # onnxruntime raises ValueError, RuntimeError, its own Fail/InvalidArgument types
        if cached is None and reader.served == 0:
            raise CalibrationError(f"empty calibration set: {source.name} yielded no feeds") from exc
        hint = f" (the range cache {source.cache} may come from another graph or method: delete it)" if cached else ""
        raise CalibrationError(f"{role}: onnxruntime quantize_static failed: {exc}{hint}") from exc
    finally:
        if bar is not None:
            bar.close()
    if cached is None and reader.served == 0:
        raise CalibrationError(f"empty calibration set: {source.name} yielded no feeds")
    ranges, ort_method = _ranges_from_cache(cache_path)
    if cached is None and source.cache is not None:
        source.write_cache(cache_path.read_bytes())
    return onnx.load(str(out_path)), ranges, ort_method, reader.served


def _progress_bar(enabled: bool, total: int | None, desc: str) -> Any:
    if not enabled:
        return None
    from edgecap._progress import ProgressBar

    return ProgressBar(total, desc)


# -- the runtime graphs of a captioner -------------------------------------------------------------------------------
@dataclasses.dataclass
class Int8Result:
    """What :func:`quantize_int8` produced.

    Attributes:
        models: graph role -> QDQ ``onnx.ModelProto`` (same roles as the FP32 input).
        preset: the preset used (``cpu-auto`` resolved, e.g. ``"cpu-vnni"``).
        calibration: JSON-ready report: feed counts, methods, per-role quantised op counts, excluded nodes, the
            decoder-feed recording statistics and the preset's settings.
        ranges: role -> tensor -> (lowest, highest) calibrated values (the calibration artefact).
    """

    models: dict[str, Any]
    preset: str
    calibration: dict[str, Any]
    ranges: dict[str, Ranges] = dataclasses.field(default_factory=dict)

    def artifact(self) -> dict[str, Any]:
        """JSON-ready calibration artefact for a bundle: preset, report and ranges (tuples as 2-element lists)."""
        return {
            "preset": self.preset,
            "calibration": self.calibration,
            "ranges": {role: {k: [lo, hi] for k, (lo, hi) in r.items()} for role, r in self.ranges.items()},
        }


#: The encoder input of a length-controllable model (``edgecap.export.specs.captioning.LEVEL_INPUT``).
LENGTH_LEVEL = "length_level"


def _with_levels(source: CalibrationSource, levels: int) -> CalibrationSource:
    """``source`` whose feeds without ``length_level`` get (B,) int64 1-based levels cycling over ``1..levels`` from
    the feed's index, so that every level is calibrated whatever the batch size."""

    def feeds() -> Iterator[dict[str, np.ndarray]]:
        for index, feed in enumerate(source):
            if LENGTH_LEVEL in feed:
                yield feed
            else:
                batch = int(next(iter(feed.values())).shape[0])
                yield {**feed, LENGTH_LEVEL: ((np.arange(batch) + index) % levels + 1).astype(np.int64)}

    return CalibrationSource(feeds if source.reiterable else feeds(), source.cache, name=source.name)


def quantize_int8(
    fp32_models: Mapping[str, Any],
    spec: Any,
    encoder_feeds: Iterable[Mapping[str, np.ndarray]],
    decode_cfg: Any,
    preset: str | QuantPreset = AUTO,
    *,
    max_decoder_feeds: int = 512,
    exclude_nodes: Sequence[str] = (),
    exclude_op_types: Sequence[str] = (),
    workdir: Path | None = None,
    progress: bool = True,
) -> Int8Result:
    """INT8 versions of a captioner's runtime graphs, calibrated on real images.

    Each role is quantised with its preset policy's scheme: the encoder with calibrated static QDQ, the step with
    static QDQ, ``dynamic`` or ``weight-only`` (``edgecap.calibration.schemes``, no calibration; docs/int8.md).

    Args:
        fp32_models: ``{"encoder": ..., "step": ...}`` FP32 runtime graphs (``ExportResult.runtime_models("fp32")``).
        spec: the model's ``ExportSpec`` (state names, token/log-prob names, state output suffix).
        encoder_feeds: batches of encoder-graph inputs from real calibration images (e.g. ``{"pixel_values"}`` or
            ``{"features", "boxes", "feature_mask"}``); the set size is the caller's choice (a few hundred images
            is typical). A list, a re-iterable or a callable is streamed twice; a generator is kept in memory. For a
            length-controllable model a feed may hold ``length_level`` (B,); without it, levels cycle over the plan.
        decode_cfg: the deployed ``DecodeCfg``; the FP32 graphs decode the calibration images with it and the step
            feeds of that decoding calibrate the step graph (a length-controllable model: at each feed's levels).
        preset: target preset name (``tensorrt``, ``cpu-avx2``, ``cpu-vnni``, ``arm64``, ``cpu-auto``) or a
            :class:`QuantPreset`.
        max_decoder_feeds: cap on recorded step feeds (a uniform sample of all steps beyond it; each feed keeps at
            most :data:`DECODER_ROWS_PER_FEED` hypotheses, and all of them at most :data:`DECODER_FEED_BYTES`).
        exclude_nodes: node names or globs kept float; prefix ``"encoder:"``/``"step:"`` to target one graph.
        exclude_op_types: op types kept float (optionally role-prefixed, e.g. ``"step:Gemm"``).
        workdir: also keep the pre-processed FP32 graphs, the QDQ graphs, the range files and the calibration report
            here (None: nothing is written).
        progress: show progress bars.

    Raises:
        CalibrationError: no encoder feeds, no decoder feed recorded, feed names not matching the graph inputs,
            exclusion patterns matching nothing, or quantisation failing.
    """
    from edgecap.runtimes.bridge import RuntimeStepModel
    from edgecap.runtimes.onnxruntime_session import OrtRuntime

    roles = list(fp32_models)
    missing = [r for r in ("encoder", "step") if r not in fp32_models]
    if missing:
        raise CalibrationError(f"fp32_models lacks role(s) {missing} (got {roles}); pass ExportResult.runtime_models()")
    extra = [r for r in roles if r not in ("encoder", "step")]
    if extra:
        raise CalibrationError(
            f"quantize_int8 quantises the encoder and step graphs; quantise {extra} with quantize_graph"
        )
    resolved = get_preset(preset)
    _check_exclusions(fp32_models, list(exclude_nodes))
    encoder_inputs = graph_inputs(fp32_models["encoder"])
    step_inputs = graph_inputs(fp32_models["step"])
    expected_step = [spec.tokens_name, *spec.state_names]
    check_feed_names(dict.fromkeys(step_inputs), expected_step, "the step graph vs spec.tokens_name/state_names")

    levels = len(getattr(spec, "length_levels", ()) or ()) if LENGTH_LEVEL in encoder_inputs else 0
    if levels:  # each image at the level its feed carries (decode would otherwise force one level on all)
        decode_cfg = decode_cfg.replace(length_level=None)
    source = as_source(encoder_feeds, "encoder calibration feeds")
    # Only a static (QDQ) step is calibrated on recorded step inputs; a dynamic or weight-only step reads none, so the
    # FP32 decode of every calibration image that records them is skipped.
    step_static = resolved.role("step").scheme == "static"
    bar = None
    if step_static:
        bar = _progress_bar(progress, source.length_hint(), "int8: decoding calibration images (fp32)")
    if levels:
        source = _with_levels(source, levels)
    kept: list[dict[str, np.ndarray]] | None = None if source.reiterable else []
    recorder = FeedRecorder(max_feeds=max_decoder_feeds, max_rows=DECODER_ROWS_PER_FEED, max_bytes=DECODER_FEED_BYTES)

    def checked(feeds: CalibrationSource) -> Iterator[dict[str, np.ndarray]]:
        for index, feed in enumerate(feeds):
            check_feed_names(feed, list(encoder_inputs), f"{feeds.name} #{index}")
            yield {k: v.astype(encoder_inputs[k], copy=False) for k, v in feed.items()}

    def on_batch(index: int, batch: dict[str, np.ndarray]) -> None:
        if kept is not None:
            kept.append({k: np.array(v, copy=True) for k, v in batch.items()})
        if bar is not None:
            bar.update()

    if step_static:
        step_model = RuntimeStepModel(
            OrtRuntime(fp32_models["encoder"], name="fp32-encoder", providers="cpu"),
            OrtRuntime(fp32_models["step"], name="fp32-step", providers="cpu"),
            spec.state_names,
            tokens_name=spec.tokens_name,
            logprobs_name=spec.logprobs_name,
            state_output_names=spec.state_output_names,
            updated_state_names=spec.step_state_names,
        )
        try:
            with step_model:
                record_decoder_feeds(
                    step_model,
                    CalibrationSource(lambda: checked(source), name=source.name),
                    decode_cfg,
                    spec.state_names,
                    recorder=recorder,
                    tokens_name=spec.tokens_name,
                    token_dtype=step_inputs[spec.tokens_name],
                    on_batch=on_batch,
                )
        finally:
            if bar is not None:
                bar.close()
        images = source.count or 0
        encoder_source = CalibrationSource(kept, source.cache, name=source.name) if kept is not None else source
    else:
        images = 0
        once = source if source.reiterable else source.materialize()
        encoder_source = CalibrationSource(lambda: checked(once), source.cache, name=source.name)

    root = Path(workdir) if workdir is not None else None
    results: dict[str, GraphInt8] = {}
    for role, feeds in (("encoder", encoder_source), ("step", recorder.source("decoder step feeds"))):
        results[role] = quantize_graph(
            fp32_models[role],
            feeds,
            resolved,
            role,
            exclude_nodes=_for_role(exclude_nodes, role, roles),
            exclude_op_types=_for_role(exclude_op_types, role, roles),
            strict_exclusions=False,
            workdir=root,
            progress=progress,
        )

    lost = [
        item
        for item in exclude_nodes
        if all(
            _split_role(item, roles)[1] in results[r].info["unmatched_exclusions"]
            for r in results
            if _split_role(item, roles)[0] in (None, r)
        )
    ]
    if not step_static:
        images = encoder_source.count or 0
    if lost:  # matched the FP32 graph, but pre-processing renamed or fused those nodes
        raise CalibrationError(f"exclude_nodes pattern(s) {lost} match no node of the pre-processed graphs")
    calibration = {
        "preset": resolved.name,
        "preset_requested": preset if isinstance(preset, str) else resolved.name,
        "quant_format": {role: "QDQ" if resolved.role(role).scheme == "static" else "QOperator" for role in results},
        "encoder_feeds": images,
        "decoder_feeds": len(recorder),
        "decoder_recording": {**recorder.stats(), "decode_strategy": getattr(decode_cfg, "strategy", None)},
        "roles": {role: r.info for role, r in results.items()},
        "settings": resolved.summary(),
    }
    if root is not None:
        atomic_write_json(root / "int8_calibration.json", calibration)
    return Int8Result(
        models={role: r.model for role, r in results.items()},
        preset=resolved.name,
        calibration=calibration,
        ranges={role: r.ranges for role, r in results.items()},
    )
