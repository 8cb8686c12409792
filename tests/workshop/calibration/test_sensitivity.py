"""Accuracy-aware INT8 on a toy graph whose middle layer is made fragile: ranking, layer naming and selection."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edgecap.workshop.export.calibration.int8 import quantize_graph  # noqa: E402
from edgecap.workshop.export.calibration.layers import param_index, quantised_layers, with_float_layers  # noqa: E402
from edgecap.workshop.export.calibration.presets import get_preset  # noqa: E402
from edgecap.workshop.export.calibration.sensitivity import (  # noqa: E402
    Int8Target,
    TargetError,
    caption_metrics,
    models_with_float,
    rank_layers,
    smallest_count,
)

PRESET = get_preset("cpu-avx2").with_step_scheme("static")
DIM, CLASSES = 16, 8


class Digits:
    """A vocabulary whose words are the token ids."""

    def decode(self, ids: list[int]) -> list[str]:
        return [str(i) for i in ids]


def weights() -> dict[str, np.ndarray]:
    """fc1 puts a ±1000 outlier on channel 0 next to unit-scale channels; fc2 ignores channel 0, so the unit-scale
    channels carry the answer and a per-tensor INT8 range on fc2's input (set by the outlier) wipes them out."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((DIM, DIM)).astype(np.float32) / 4
    w1[:, 0] = 1000.0
    w2 = rng.standard_normal((DIM, DIM)).astype(np.float32)
    w2[0, :] = 0.0
    w3 = rng.standard_normal((DIM, CLASSES)).astype(np.float32)
    return {"fc1": w1, "fc2": w2, "fc3": w3}


def toy_graph() -> Any:
    """x (B, 16) -> fc1 -> fc2 -> fc3 -> logits (B, 8); fc1/fc3 weights named like torch parameters
    (``fc1.weight``), fc2's anonymous (``val_7``, as the dynamo exporter folds a Linear's transposed weight)."""
    w = weights()
    inits = [
        numpy_helper.from_array(w["fc1"], "fc1.weight"),
        numpy_helper.from_array(w["fc2"], "val_7"),
        numpy_helper.from_array(w["fc3"], "fc3.weight"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "fc1.weight"], ["h1"], name="node_MatMul_1"),
        helper.make_node("MatMul", ["h1", "val_7"], ["h2"], name="node_MatMul_2"),
        helper.make_node("MatMul", ["h2", "fc3.weight"], ["logits"], name="node_MatMul_3"),
    ]
    graph = helper.make_graph(
        nodes,
        "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", DIM])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", CLASSES])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def inputs(seed: int, rows: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, DIM)).astype(np.float32)


def tokens(models: dict[str, Any], x: np.ndarray) -> list[list[int]]:
    """Each row of ``x`` is one "image" whose "caption" is the argmax class."""
    import onnxruntime

    session = onnxruntime.InferenceSession(models["step"].SerializeToString(), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"x": x})[0]
    return [[int(c)] for c in logits.argmax(axis=1)]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fully quantised graphs, pre-processed FP32 graphs), calibrated once."""
    work = tmp_path_factory.mktemp("toy-int8")
    feeds = [{"x": inputs(1, 16)} for _ in range(4)]
    result = quantize_graph(toy_graph(), feeds, PRESET, role="step", workdir=work)
    return {"step": result.model}, {"step": onnx.load(str(work / "step.fp32-pre.onnx"))}


def layers(quantized) -> list:
    qdq, originals = quantized
    # fc2's anonymous weight is named by the torch parameter it equals (stored transposed there, as nn.Linear does)
    params = param_index([("fc2.weight", weights()["fc2"].T)])
    return quantised_layers(qdq["step"], originals["step"], "step", ("MatMul", "Gemm"), params)


def test_layers_are_named_by_module_from_parameters_and_weight_names(quantized):
    found = layers(quantized)
    assert [(x.key, x.nodes) for x in found] == [
        ("step:fc1", ("node_MatMul_1",)),
        ("step:fc2", ("node_MatMul_2",)),
        ("step:fc3", ("node_MatMul_3",)),
    ]
    qdq, originals = quantized
    unnamed = quantised_layers(qdq["step"], originals["step"], "step", ("MatMul",))
    assert [x.name for x in unnamed] == ["fc1", "node_MatMul_2", "fc3"]  # no parameters: the node is the layer


def test_a_float_layer_reads_float_inputs_and_the_rest_stay_quantised(quantized):
    qdq, originals = quantized
    fc2 = layers(quantized)[1]
    partly = with_float_layers(qdq["step"], originals["step"], [fc2])
    producer = {o: n.op_type for n in partly.graph.node for o in n.output}
    by_name = {n.name: n for n in partly.graph.node}
    assert [producer.get(i) for i in by_name["node_MatMul_2"].input] == ["MatMul", None]  # h1 and the float weight
    assert all(producer.get(i) == "DequantizeLinear" for i in by_name["node_MatMul_3"].input)
    assert "val_7" in {t.name for t in partly.graph.initializer}
    assert len(qdq["step"].graph.node) > len(partly.graph.node)  # the copy changed, not the original


def test_leave_one_out_ranks_the_fragile_layer_first_and_selection_keeps_exactly_it(quantized):
    qdq, originals = quantized
    fp32 = {"step": toy_graph()}
    rank_x, held_x = inputs(2, 64), inputs(3, 200)
    base, effects = rank_layers(
        layers(quantized), qdq, originals, lambda m: tokens(m, rank_x), tokens(fp32, rank_x), Digits()
    )
    assert base["agreement"] < 0.6  # the fully quantised toy is badly off
    assert effects[0].layer.key == "step:fc2"
    assert effects[0].gain["agreement"] > 0.3 > max(e.gain["agreement"] for e in effects[1:])
    record = effects[0].record()
    assert record["layer"] == "step:fc2" and record["nodes"] == 1 and record["agreement_gain"] > 0.3

    target = Int8Target(min_agreement=0.9)
    reference = tokens(fp32, held_x)

    def holds(k: int) -> bool:
        models = models_with_float(qdq, originals, [e.layer for e in effects[:k]])
        metrics = caption_metrics(reference, tokens(models, held_x), Digits())
        quality = {"reference_cider_d": 1.0, "candidate_cider_d": 1.0, "agreement": metrics["agreement"]}
        return not target.shortfalls(quality)

    found = smallest_count(len(effects), holds)
    assert found.count == 1 and found.tried[0] is False and found.tried[1] is True


@pytest.mark.parametrize(
    ("needed", "n", "count"), [(0, 5, 0), (1, 5, 1), (3, 8, 3), (5, 5, 5), (6, 7, 6), (None, 4, None), (None, 0, None)]
)
def test_the_search_finds_the_smallest_count_of_a_monotone_check(needed, n, count):
    calls: list[int] = []

    def holds(k: int) -> bool:
        calls.append(k)
        return needed is not None and k >= needed

    found = smallest_count(n, holds)
    assert found.count == count
    assert len(calls) == len(set(calls)) and calls[0] == 0  # each count once, the free case first


def test_targets_are_checked_at_every_level_and_out_of_range_values_refused():
    target = Int8Target(max_cider_drop=0.3, min_agreement=0.85)
    ok = {"reference_cider_d": 0.806, "candidate_cider_d": 0.804, "agreement": 0.9}
    assert target.shortfalls(ok) == []
    dropped = {**ok, "candidate_cider_d": 0.80}  # 0.6 points
    assert [s.split(" below")[0] for s in target.shortfalls(dropped)] == ["CIDEr-D 0.60 points"]
    levels = {**ok, "levels": {"1": ok, "2": {**ok, "agreement": 0.5}}}
    assert target.shortfalls(levels) == ["50.0% captions identical to FP32 at length level 2 (at least 85.0%)"]
    for bad in ({}, {"max_cider_drop": -1.0}, {"max_cider_drop": 101.0}, {"min_agreement": 85.0}):
        with pytest.raises(TargetError):
            Int8Target(**bad)


def test_a_float_conv_after_a_fused_relu6_reads_the_clamped_tensor(tmp_path):
    """The encoder presets fold a ``Clip`` into the quantised ``Conv`` before it; keeping the next conv float must
    put the clamp back, else it reads values above 6 that FP32 never feeds it."""
    import onnxruntime

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 3).astype(np.float32), "conv1.weight")
    w2 = numpy_helper.from_array(rng.standard_normal((2, 4, 1, 1)).astype(np.float32), "conv2.weight")
    lo, hi = numpy_helper.from_array(np.float32(0.0), "lo"), numpy_helper.from_array(np.float32(6.0), "hi")
    nodes = [
        helper.make_node("Conv", ["x", "conv1.weight"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"], name="relu6"),
        helper.make_node("Conv", ["r1", "conv2.weight"], ["y"], name="conv2"),
    ]
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 2, 8, 8])],
        [w1, w2, lo, hi],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = [{"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)} for _ in range(3)]
    qdq = quantize_graph(model, feeds, get_preset("cpu-avx2"), role="encoder", workdir=tmp_path).model
    assert "Clip" not in {n.op_type for n in qdq.graph.node}  # folded into conv1's output range
    pre = onnx.load(str(tmp_path / "encoder.fp32-pre.onnx"))
    conv2 = [x for x in quantised_layers(qdq, pre, "encoder", ("Conv",)) if x.name == "conv2"]
    partly = with_float_layers(qdq, pre, conv2)
    producer = {o: n.op_type for n in partly.graph.node for o in n.output}
    assert producer[next(n for n in partly.graph.node if n.name == "conv2").input[0]] == "Clip"

    def run(m) -> np.ndarray:
        session = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, feeds[0])[0]

    fp32, fused, back = run(model), run(qdq), run(partly)
    assert np.abs(back - fp32).max() <= np.abs(fused - fp32).max() + 1e-3


def test_every_layer_float_is_the_fp32_graph(quantized):
    """Q/DQ pairs no integer op reads any more are dropped, readers included: all layers float computes FP32."""
    import onnxruntime

    qdq, originals = quantized
    every = with_float_layers(qdq["step"], originals["step"], layers(quantized))
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in every.graph.node}
    x = inputs(5, 8)
    run = lambda m: onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(  # noqa: E731
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(run(every), run(toy_graph()), rtol=1e-5, atol=1e-3)
