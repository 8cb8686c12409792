"""Float16 graphs: fp16 weights and compute, fp32 inputs/outputs, fp32 islands from the spec's policy.

Correctness only: on this CPU fp16 runs slower than fp32 (ONNX Runtime inserts casts), so no timing is asserted.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeSession
from edgecap.workshop.export import Fp16Policy
from edgecap.workshop.export.fp16 import (
    convert_to_fp16,
    drop_cast_round_trips,
    fp32_ancestor_nodes,
    isolate_graph_outputs,
)
from edgecap.workshop.export.graph import check_model
from tests.workshop.export.helpers import TEST_CONFIGS, exported, exported_with_backbone, graph_cases

FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16


def _types(model: onnx.ModelProto) -> dict[str, int]:
    graph = model.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*graph.input, *graph.value_info, *graph.output)}
    types.update({t.name: t.data_type for t in graph.initializer})
    return types


@pytest.mark.parametrize(("config", "graph"), graph_cases(runtime_only=True))
def test_fp16_graph_has_fp32_interface_and_fp16_weights(config: str, graph: str) -> None:
    fp32, fp16 = exported(config).model(graph, "fp32"), exported(config).model(graph, "fp16")
    for a, b in zip((*fp32.graph.input, *fp32.graph.output), (*fp16.graph.input, *fp16.graph.output), strict=True):
        assert a.name == b.name and a.type.tensor_type.elem_type == b.type.tensor_type.elem_type
    # constants of the float32 box-angle path (the frequency matrix of the box angles) are not weights
    angle_path = set(fp32_ancestor_nodes(fp16, ("Sin", "Cos"), ("Gemm", "Conv")))
    angle_constants = {i for n in fp16.graph.node if n.name in angle_path for i in n.input}
    matrices = [t for t in fp16.graph.initializer if len(t.dims) == 2 and t.name not in angle_constants]
    assert matrices and all(t.data_type == HALF for t in matrices)  # every weight matrix is float16
    weight_bytes = [sum(t.ByteSize() for t in m.graph.initializer) for m in (fp32, fp16)]
    assert weight_bytes[1] < 0.6 * weight_bytes[0]


@pytest.mark.parametrize("graph", ["init", "step"])
def test_sensitive_ops_stay_fp32(graph: str) -> None:
    model = check_model(exported(TEST_CONFIGS[0]).model(graph, "fp16"), "fp16")
    types = _types(model)
    kept = [n for n in model.graph.node if n.op_type in ("LayerNormalization", "Softmax", "LogSoftmax", "Sin", "Cos")]
    assert kept
    for node in kept:
        assert types[node.input[0]] == FLOAT, (node.name, node.op_type)
    matmuls = [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm")]
    assert any(types[n.output[0]] == HALF for n in matmuls)  # the compute really is float16


def test_box_embedding_reads_fp32_boxes() -> None:
    """The whole computation feeding sin/cos is float32 back to the ``boxes`` input, with no fp16 round trip."""
    model = check_model(exported(TEST_CONFIGS[0]).model("init", "fp16"), "fp16")
    types = _types(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    pending = [n for n in model.graph.node if n.op_type in ("Sin", "Cos")]
    seen, reached_boxes = set(), False
    while pending:
        node = pending.pop()
        if node.name in seen:
            continue
        seen.add(node.name)
        for name in node.input:
            if name == "boxes":
                reached_boxes = True
            if types.get(name) == HALF:
                pytest.fail(f"{node.op_type} {node.name} reads float16 {name!r} on the way to sin/cos")
            if name in producer and producer[name].op_type != "Shape":
                pending.append(producer[name])
    assert reached_boxes


def test_backbone_grid_embedding_stays_fp32() -> None:
    model = check_model(exported_with_backbone().model("init", "fp16"), "fp16")
    types = _types(model)
    for node in model.graph.node:
        if node.op_type in ("Sin", "Cos", "Log"):
            assert types[node.input[0]] == FLOAT, node.name
    assert any(t.data_type == HALF for t in model.graph.initializer if t.dims and len(t.dims) == 4)  # conv weights


def _output_also_consumed() -> onnx.ModelProto:
    """``h = x + 1`` is a graph output *and* feeds ``y = h * 2``: the shape onnxconverter-common mistypes."""
    x = helper.make_tensor_value_info("x", FLOAT, ["n"])
    outs = [helper.make_tensor_value_info(n, FLOAT, ["n"]) for n in ("h", "y")]
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("one", 1.0), ("two", 2.0))]
    nodes = [helper.make_node("Add", ["x", "one"], ["h"]), helper.make_node("Mul", ["h", "two"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_output_consumed_inside_the_graph_converts() -> None:
    model = _output_also_consumed()
    isolated = onnx.ModelProto()
    isolated.CopyFrom(model)
    assert isolate_graph_outputs(isolated) == 1
    assert isolated.graph.node[-1].op_type == "Identity" and isolated.graph.node[-1].output[0] == "h"
    converted = check_model(convert_to_fp16(model, Fp16Policy()), "toy")
    assert all(o.type.tensor_type.elem_type == FLOAT for o in converted.graph.output)
    with OnnxRuntimeSession(converted) as rt:
        out = rt.infer({"x": np.array([0.5, 3.0], np.float32)})
    np.testing.assert_allclose(out["h"], [1.5, 4.0], rtol=1e-3)
    np.testing.assert_allclose(out["y"], [3.0, 8.0], rtol=1e-3)


def test_cast_round_trips_are_bypassed() -> None:
    x = helper.make_tensor_value_info("x", FLOAT, [2])
    y = helper.make_tensor_value_info("y", FLOAT, [2])
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], to=HALF),
        helper.make_node("Cast", ["x16"], ["x32"], to=FLOAT),
        helper.make_node("Sin", ["x32"], ["y"]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 20)])
    assert drop_cast_round_trips(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Sin"] and model.graph.node[0].input[0] == "x"
    x = np.array([700.3, 1.0], np.float32)
    with OnnxRuntimeSession(model) as rt:  # 700 rad: float16 rounding alone would move sin by ~0.2
        np.testing.assert_allclose(rt.infer({"x": x})["y"], np.sin(x.astype(np.float64)), atol=1e-6)


def test_ancestor_cone_stops_at_projections_and_shapes() -> None:
    x = helper.make_tensor_value_info("x", FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", FLOAT, [2, 2])
    w = numpy_helper.from_array(np.eye(2, dtype=np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"], name="proj"),
        helper.make_node("Shape", ["p"], ["s"], name="shape"),
        helper.make_node("Mul", ["p", "p"], ["q"], name="square"),
        helper.make_node("Sin", ["q"], ["y"], name="sin"),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], initializer=[w]))
    assert sorted(fp32_ancestor_nodes(model, ("Sin",), ("MatMul",))) == ["sin", "square"]
