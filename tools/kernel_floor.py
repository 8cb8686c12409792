"""The floor ONNX Runtime's own kernels put under one decoder step: its weight matmuls with nothing else.

The weight-read limit (``research/side_by_side.py``) says how fast a step could be if it did nothing but stream its
weights. This says how fast it can be on ONNX Runtime's CPU kernels with everything but the weight matmuls free. Every
node of the *optimised* step graph (as ONNX Runtime runs it: ``DynamicQuantizeMatMul``, ``MatMulIntegerToFloat``,
``MatMulNBits``, ``MatMul``, ``FusedMatMul``, ``Gemm`` …) that reads an initializer is copied, with its weights, into
one graph of those nodes alone, each fed random inputs of the types and shapes it saw in a real step (ONNX Runtime's
profiler records them). One run of that graph runs every weight matmul once, in the step's order, with the step's
working set of weights: ``floor_s``, its median. ``hot_floor_s`` sums each node timed in a graph of its own (its
weights hot in the cache), less a ``session.run``'s own cost per node, plus that cost once: what the kernels do with no
cache misses.

Where the floor is already above twice the weight-read limit, no layout of the rest of the step graph brings the step
within 2× of the limit on these kernels: that takes faster kernels (a fused GEMV streaming INT8 weights at the
cache's rate), not another graph.

Usage: ``python research/side_by_side.py --limit-only`` reports it beside the limit (as does
``research/step_profile.py`` per node kind); ``kernel_floor(step_path, feed)`` from Python.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

#: Ops ONNX Runtime's CPU provider runs a matrix product as, after its fusions; one reading an initializer multiplies
#: by a weight.
MATMUL_OPS = frozenset(
    {"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"}
    | {"QGemm", "QLinearMatMul", "MatMulNBits", "MatMulBnb4"}
)
#: ONNX Runtime profiler type names -> numpy dtypes of the inputs a weight matmul takes.
PROFILE_DTYPES = {
    "float": np.float32,
    "float16": np.float16,
    "int8": np.int8,
    "uint8": np.uint8,
    "int32": np.int32,
    "int64": np.int64,
}


def weight_matmuls(model: Any) -> list[Any]:
    """The nodes of an (ONNX Runtime-optimised) ``onnx.ModelProto`` that multiply by an initializer."""
    weights = {t.name for t in model.graph.initializer}
    return [n for n in model.graph.node if n.op_type in MATMUL_OPS and any(i in weights for i in n.input)]


def session_options(threads: int = 1) -> Any:
    """ONNX Runtime session options for measuring: ``threads`` intra-op threads, one inter-op thread, no spinning."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def profile_runs(path: Path, feed: Mapping[str, Any], runs: int, threads: int = 1) -> tuple[list[Any], Any]:
    """ONNX Runtime profiler events of ``runs`` runs of the graph at ``path`` on ``feed``, and the graph as ONNX
    Runtime optimised it (an ``onnx.ModelProto``: ONNX Runtime renames and fuses nodes, and the events name the
    optimised nodes)."""
    import onnx
    import onnxruntime

    with tempfile.TemporaryDirectory(prefix="edgecap-profile-") as tmp:
        options = session_options(threads)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "run")
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            session.run(None, dict(feed))
        events = json.loads(Path(session.end_profiling()).read_text())
        return events, onnx.load(options.optimized_model_filepath)


def kernel_events(events: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(node name, event)`` for each node-kernel event of an ONNX Runtime profile (one per node and run)."""
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") == "Node" and name.endswith("_kernel_time"):
            yield name[: -len("_kernel_time")], event


def profiled_input_shapes(events: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """Node name -> ``[(type, shape), ...]`` of its inputs in the first profiled run (ONNX Runtime's
    ``input_type_shape``)."""
    shapes: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for node, event in kernel_events(events):
        if node in shapes:
            continue
        entries = event.get("args", {}).get("input_type_shape", [])
        shapes[node] = [(dtype, tuple(int(d) for d in dims)) for entry in entries for dtype, dims in entry.items()]
    return shapes


def align_inputs(
    node: Any, initializers: Mapping[str, Any], entries: Sequence[tuple[str, tuple[int, ...]]]
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Input name -> profiled (type, shape) for the inputs of ``node`` that are not initializers.

    ONNX Runtime's profiler lists a node's inputs in order but leaves out a weight its kernel pre-packed at load time,
    so an initializer whose dims do not match the next entry is taken as left out."""
    aligned: dict[str, tuple[str, tuple[int, ...]]] = {}
    position = 0
    for name in (n for n in node.input if n):
        entry = entries[position] if position < len(entries) else None
        if name in initializers:
            if entry is not None and entry[1] == tuple(initializers[name].dims):
                position += 1
            continue
        if entry is None:
            raise ValueError(f"node {node.name!r}: no profiled shape for its input {name!r}")
        aligned[name] = entry
        position += 1
    return aligned


def matmuls_model(model: Any, nodes: Sequence[Any], shapes: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``nodes`` of ``model`` side by side in one graph with the initializers they read, each fed its own random
    inputs in the types and shapes the profiler recorded for it (``shapes``: node name -> entries, see
    :func:`align_inputs`), its first output a graph output (float; int32 for ``MatMulInteger``): one run runs every
    node once, in order, nothing else.

    Inputs and outputs are renamed per node (``NODE/NAME``), so no node reads another's output."""
    from onnx import TensorProto, helper

    initializers = {t.name: t for t in model.graph.initializer}
    rng = np.random.default_rng(0)
    graph_inputs, feed, copies, outputs = [], {}, [], []
    for node in nodes:
        renamed = {}
        for name, (dtype, shape) in align_inputs(node, initializers, shapes[node.name]).items():
            if dtype not in PROFILE_DTYPES:
                raise ValueError(f"node {node.name!r}: input {name!r} has unsupported type {dtype!r}")
            np_dtype = np.dtype(PROFILE_DTYPES[dtype])
            if np_dtype.kind == "f":
                value = rng.random(shape, dtype=np.float32).astype(np_dtype)
            else:
                info = np.iinfo(cast("np.dtype[np.integer[Any]]", np_dtype))  # not a float: an integer type
                value = rng.integers(max(info.min, -128), min(info.max, 255), size=shape, endpoint=True)
                value = value.astype(np_dtype)
            renamed[name] = f"{node.name}/{name}"
            feed[renamed[name]] = value
            graph_inputs.append(
                helper.make_tensor_value_info(renamed[name], helper.np_dtype_to_tensor_dtype(np_dtype), shape)
            )
        copy = type(node)()
        copy.CopyFrom(node)
        copy.input[:] = [renamed.get(name, name) for name in node.input]
        copy.output[:] = [f"{node.name}/{name}" if name else name for name in node.output]
        elem = TensorProto.INT32 if node.op_type == "MatMulInteger" else TensorProto.FLOAT
        rank = max(len(feed[name].shape) for name in renamed.values())  # the activation's rank, as the output's
        outputs.append(helper.make_tensor_value_info(copy.output[0], elem, [None] * rank))
        copies.append(copy)
    used = {name for node in nodes for name in node.input if name in initializers}
    weights = [t for t in model.graph.initializer if t.name in used]
    graph = helper.make_graph(copies, "weight_matmuls", graph_inputs, outputs, weights)
    combined = helper.make_model(graph, opset_imports=list(model.opset_import))
    combined.ir_version = model.ir_version
    return combined, feed


def _session(model_bytes: bytes, optimise: bool) -> Any:
    import onnxruntime

    options = session_options()
    if not optimise:  # the node is already what ONNX Runtime runs; keep it so
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def median_run_s(session: Any, feed: Mapping[str, Any], runs: int, warmup: int = 20) -> float:
    """Median wall seconds of ``session.run`` on ``feed`` over ``runs`` runs after ``warmup``."""
    for _ in range(warmup):
        session.run(None, dict(feed))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, dict(feed))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_overhead_s(runs: int = 2000) -> float:
    """Median seconds of a ``session.run`` of a one-``Identity`` graph on a 256-float input: what any run costs."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return median_run_s(_session(model.SerializeToString(), True), {"x": np.zeros((1, 256), np.float32)}, runs)


def kernel_floor(step_path: Path, feed: Mapping[str, Any], runs: int = 300) -> dict[str, Any]:
    """The floor of the step graph at ``step_path`` on the inputs ``feed`` (see the module docstring).

    Returns ``floor_s`` (the weight matmuls together), ``hot_floor_s`` (each alone), ``run_overhead_s``, ``matmuls``
    (their count) and ``nodes``: per node its name, op type, weight shape and seconds alone (``alone_s``)."""
    events, optimised = profile_runs(step_path, feed, runs=1)
    shapes = profiled_input_shapes(events)
    overhead = run_overhead_s()
    weights = {t.name: tuple(t.dims) for t in optimised.graph.initializer}
    matmuls = weight_matmuls(optimised)
    missing = [node.name for node in matmuls if node.name not in shapes]
    if missing:
        raise ValueError(f"nodes {missing} of the optimised step graph did not run in the profiled step")
    nodes = []
    for node in matmuls:
        alone, node_feed = matmuls_model(optimised, [node], shapes)
        seconds = median_run_s(_session(alone.SerializeToString(), False), node_feed, runs)
        weight = next(weights[i] for i in node.input if i in weights)
        nodes.append({"name": node.name, "op": node.op_type, "weight_shape": list(weight), "alone_s": seconds})
    together, feed_all = matmuls_model(optimised, matmuls, shapes)
    floor = median_run_s(_session(together.SerializeToString(), False), feed_all, runs)
    return {
        "floor_s": floor,
        "hot_floor_s": sum(max(0.0, n["alone_s"] - overhead) for n in nodes) + overhead,
        "run_overhead_s": overhead,
        "matmuls": len(nodes),
        "nodes": nodes,
    }
