"""``benchmarks/kernel_floor.py``: which nodes are weight matmuls, matching the profiler's shapes to a node's inputs,
the matmuls-only graph computing what the nodes compute, and the floor of a small dynamically quantised graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.scripts import load_script


@pytest.fixture(scope="module")
def script():  # type: ignore[no-untyped-def]
    return load_script("kernel_floor")


def _step_like(path: Path) -> Path:
    """x (R, 8) -> MatMul W1 -> Relu -> MatMul W2 + Add b -> q·kᵀ with an input k: two weight matmuls, one not."""
    rng = np.random.default_rng(0)
    inits = {
        "W1": rng.standard_normal((8, 16)).astype(np.float32),
        "W2": rng.standard_normal((16, 8)).astype(np.float32),
        "b": rng.standard_normal(8).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="first"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W2"], ["p"], name="second"),
        helper.make_node("Add", ["p", "b"], ["q"], name="bias"),
        helper.make_node("MatMul", ["q", "k"], ["scores"], name="attention"),
    ]
    graph = helper.make_graph(
        nodes,
        "step",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["R", 8]),
            helper.make_tensor_value_info("k", TensorProto.FLOAT, [8, 5]),
        ],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["R", 5])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_weight_matmuls_are_the_matmuls_reading_an_initializer(script, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(str(_step_like(tmp_path / "step.onnx")))
    assert [n.name for n in script.weight_matmuls(model)] == ["first", "second"]


def test_profiled_shapes_skip_a_prepacked_weight_and_keep_a_listed_one(script) -> None:  # type: ignore[no-untyped-def]
    """ORT's profiler leaves out a weight its kernel pre-packed (here B of a DynamicQuantizeMatMul) and lists the
    others (its scale, zero point, bias): only the activation's entry is taken."""
    node = helper.make_node("DynamicQuantizeMatMul", ["a", "B", "s", "zp", "bias"], ["y"], domain="com.microsoft")
    inits = {
        "B": numpy_helper.from_array(np.zeros((4, 6), np.int8), "B"),
        "s": numpy_helper.from_array(np.ones(6, np.float32), "s"),
        "zp": numpy_helper.from_array(np.zeros(6, np.int8), "zp"),
        "bias": numpy_helper.from_array(np.zeros(6, np.float32), "bias"),
    }
    entries = [("float", (3, 4)), ("float", (6,)), ("int8", (6,)), ("float", (6,))]
    assert script.align_inputs(node, inits, entries) == {"a": ("float", (3, 4))}
    listed = [("float", (3, 4)), ("int8", (4, 6)), ("float", (6,)), ("int8", (6,)), ("float", (6,))]
    assert script.align_inputs(node, inits, listed) == {"a": ("float", (3, 4))}
    with pytest.raises(ValueError, match="no profiled shape"):
        script.align_inputs(node, inits, [])


def test_profiled_shapes_come_from_the_first_run_of_each_node(script) -> None:  # type: ignore[no-untyped-def]
    events = [
        {"cat": "Session", "name": "model_run"},
        {"cat": "Node", "name": "mm_kernel_time", "args": {"input_type_shape": [{"float": [1, 8]}, {"float": [8, 4]}]}},
        {"cat": "Node", "name": "mm_kernel_time", "args": {"input_type_shape": [{"float": [2, 8]}, {"float": [8, 4]}]}},
        {"cat": "Node", "name": "mm_fence_before"},
    ]
    assert script.profiled_input_shapes(events) == {"mm": [("float", (1, 8)), ("float", (8, 4))]}


def test_matmuls_graph_computes_what_each_node_computes(script, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    model = onnx.load(str(_step_like(tmp_path / "step.onnx")))
    nodes = script.weight_matmuls(model)
    shapes = {"first": [("float", (3, 8)), ("float", (8, 16))], "second": [("float", (3, 16)), ("float", (16, 8))]}
    combined, feed = script.matmuls_model(model, nodes, shapes)
    onnx.checker.check_model(combined)
    assert sorted(feed) == ["first/x", "second/r"] and feed["first/x"].shape == (3, 8)
    session = ort.InferenceSession(combined.SerializeToString(), providers=["CPUExecutionProvider"])
    first, second = session.run(["first/h", "second/p"], feed)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_allclose(first, feed["first/x"] @ weights["W1"], rtol=1e-5)
    np.testing.assert_allclose(second, feed["second/r"] @ weights["W2"], rtol=1e-5)


def test_floor_of_a_dynamically_quantised_step(script, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The INT8 form ORT runs (its fused integer matmuls) is what is timed, every weight matmul once."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = tmp_path / "int8.onnx"
    quantize_dynamic(str(_step_like(tmp_path / "step.onnx")), str(path), weight_type=QuantType.QInt8)
    feed = {"x": np.ones((3, 8), np.float32), "k": np.ones((8, 5), np.float32)}
    floor = script.kernel_floor(path, feed, runs=5)
    assert floor["matmuls"] == 2 == len(floor["nodes"])
    assert {n["op"] for n in floor["nodes"]} <= script.MATMUL_OPS - {"MatMul"}
    assert sorted(tuple(n["weight_shape"]) for n in floor["nodes"]) == [(8, 16), (16, 8)]
    assert floor["floor_s"] > 0 and floor["run_overhead_s"] > 0 and all(n["alone_s"] > 0 for n in floor["nodes"])
