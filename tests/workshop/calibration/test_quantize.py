"""quantize_int8 / quantize_graph: static QDQ graphs per preset, float attention, exclusions, errors, range cache."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeSession  # noqa: E402
from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model  # noqa: E402
from edgecap.workshop.export.calibration import (  # noqa: E402
    CalibrationError,
    CalibrationSource,
    QuantPreset,
    RolePolicy,
    compare_decoders,
    detect_cpu_preset,
    get_preset,
    list_presets,
    quantize_graph,
    quantize_int8,
    record_decoder_feeds,
)
from edgecap.workshop.export.calibration.presets import ENCODER_ROLE  # noqa: E402

WEIGHT_OPS = {"MatMul", "Gemm", "Conv"}
#: The CPU presets with their step kept on static QDQ (what this module tests; the default step schemes are in
#: test_schemes.py).
STATIC_AVX2 = get_preset("cpu-avx2").with_step_scheme("static")
STATIC_VNNI = get_preset("cpu-vnni").with_step_scheme("static")


# -- graph inspection helpers ----------------------------------------------------------------------------------------
def producers(model) -> dict:
    return {o: n for n in model.graph.node for o in n.output}


def initializers(model) -> dict:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def dq_fed(model, node) -> bool:
    prod = producers(model)
    return any(i in prod and prod[i].op_type == "DequantizeLinear" for i in node.input)


def zero_point_types(model, weights: bool) -> set:
    """Element types of the zero points of QuantizeLinear (activations) or of weight DequantizeLinears."""
    inits = {t.name: t for t in model.graph.initializer}
    types = set()
    for node in model.graph.node:
        is_weight = node.op_type == "DequantizeLinear" and node.input[0] in inits
        if weights and is_weight and inits[node.input[0]].data_type != TensorProto.INT32:  # not the int32 biases
            types.add(inits[node.input[2]].data_type)
        if not weights and node.op_type == "QuantizeLinear":
            types.add(inits[node.input[2]].data_type)
    return types


def weight_arrays(model) -> list[np.ndarray]:
    """Quantised weights: constant inputs of DequantizeLinear, without the int32 biases of Gemm."""
    inits = initializers(model)
    dq_constants = [
        inits[n.input[0]] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
    ]
    return [w for w in dq_constants if w.dtype != np.int32]


# -- fixtures --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def calib(region_feeds):
    return region_feeds(6, batch=4, seed=1)


@pytest.fixture(scope="module")
def avx2(acort, calib):
    return quantize_int8(acort.fp32, acort.spec, calib, acort.cfg("beam", beam_size=2), STATIC_AVX2, progress=False)


@pytest.fixture(scope="module")
def trt(acort, calib):
    return quantize_int8(acort.fp32, acort.spec, calib[:3], acort.cfg("greedy"), "tensorrt", progress=False)


# -- structure -------------------------------------------------------------------------------------------------------
def test_qdq_graphs_quantise_weights_only_where_the_preset_says(avx2, acort) -> None:
    assert set(avx2.models) == {"encoder", "step"} and avx2.preset == "cpu-avx2"
    for role, model in avx2.models.items():
        onnx.checker.check_model(model)
        assert {i.domain for i in model.opset_import} <= {"", "ai.onnx"}  # nothing TensorRT would not know
        ops = [n.op_type for n in model.graph.node]
        assert ops.count("QuantizeLinear") > 0 and ops.count("DequantizeLinear") > 0, role
        assert weight_arrays(model) and all(w.dtype == np.int8 for w in weight_arrays(model))
        prod = producers(model)
        consumers = {n.op_type for n in model.graph.node if dq_fed(model, n) and n.op_type != "QuantizeLinear"}
        assert consumers <= WEIGHT_OPS, (role, consumers)
        constants = set(initializers(model))
        for node in model.graph.node:
            if node.op_type in ("Softmax", "LogSoftmax", "LayerNormalization", "Add", "Mul", "Concat", "Where"):
                assert not dq_fed(model, node), (role, node.name)  # mask, softmax, residuals, caches: float
            second = prod.get(node.input[1]) if node.op_type == "MatMul" else None
            if second is not None and node.input[1] not in constants and second.op_type != "DequantizeLinear":
                assert not dq_fed(model, node), (role, node.name)  # attention Q·Kᵀ and P·V stay float
        for output in model.graph.output:  # states and log-probs leave the graph in float, never via a DQ
            assert output.name not in prod or prod[output.name].op_type != "DequantizeLinear"
        meta = {p.key: p.value for p in model.metadata_props}
        assert meta["precision"] == "int8" and meta["int8_preset"] == "cpu-avx2" and meta["graph_role"]
    info = avx2.calibration["roles"]["step"]
    assert info["quantized_ops"]["MatMul"] > 0 and info["quantized_ops"]["Gemm"] == 1
    assert info["float_activation_matmuls"] > 0 and info["portable"]


def test_presets_are_visible_in_the_graph(avx2, trt, acort, calib) -> None:
    uint8, int8 = TensorProto.UINT8, TensorProto.INT8
    for role in ("encoder", "step"):
        assert zero_point_types(avx2.models[role], weights=False) == {uint8}  # asymmetric unsigned activations
        assert zero_point_types(trt.models[role], weights=False) == {int8}  # TensorRT: signed, symmetric
        assert zero_point_types(trt.models[role], weights=True) == {int8}
        inits = initializers(trt.models[role])
        q_nodes = [n for n in trt.models[role].graph.node if n.op_type == "QuantizeLinear"]
        assert all(not inits[n.input[2]].any() for n in q_nodes)  # zero points are 0
        uses: dict = {}
        for node in trt.models[role].graph.node:
            for name in node.input:
                uses[name] = uses.get(name, 0) + 1
        prod = producers(trt.models[role])
        activation_dq = [
            n.output[0]
            for n in trt.models[role].graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in prod and prod[n.input[0]].op_type == "QuantizeLinear"
        ]
        assert activation_dq and all(uses.get(o, 0) == 1 for o in activation_dq)  # a dedicated pair per consumer
        # reduce_range: 7-bit weights on AVX2; full 8-bit range elsewhere
        assert max(int(np.abs(w.astype(np.int32)).max()) for w in weight_arrays(avx2.models[role])) <= 64
        assert max(int(np.abs(w.astype(np.int32)).max()) for w in weight_arrays(trt.models[role])) == 127
    assert trt.calibration["roles"]["encoder"]["method"] == "entropy"  # fixed-shape encoder feeds
    assert trt.calibration["roles"]["step"]["method"] == "minmax"  # decoder feeds vary in shape
    assert trt.calibration["roles"]["step"]["portable"]


def test_int8_runs_in_onnx_runtime_close_to_fp32(avx2, acort, region_feeds) -> None:
    test = region_feeds(4, batch=4, seed=9)
    fp32 = acort.fp32
    cfg = acort.cfg("greedy")
    with (
        create_onnxruntime_step_model(fp32["encoder"], fp32["step"]) as ref,
        create_onnxruntime_step_model(avx2.models["encoder"], avx2.models["step"]) as cand,
    ):
        report = compare_decoders(ref, cand, test, None, acort.vocab, cfg)
        feeds = record_decoder_feeds(ref, test, cfg, acort.spec.state_names).feeds
        memory_ref = ref.encode(test[0])["cross_k"]
        memory_int8 = cand.encode(test[0])["cross_k"]
    assert report["images"] == 16
    assert report["caption_agreement_pct"] >= 50.0 and report["token_agreement_pct"] >= 80.0
    error = np.linalg.norm(memory_int8 - memory_ref) / np.linalg.norm(memory_ref)
    assert error < 0.15
    agree = total = 0
    with OnnxRuntimeSession(fp32["step"]) as a, OnnxRuntimeSession(avx2.models["step"]) as b:
        for feed in feeds:
            top_a = a.infer(feed)["logprobs"].argmax(-1)
            top_b = b.infer(feed)["logprobs"].argmax(-1)
            agree, total = agree + int((top_a == top_b).sum()), total + top_a.size
    assert agree / total >= 0.85


def test_report_and_ranges_are_json(avx2, calib) -> None:
    cal = avx2.calibration
    assert cal["encoder_feeds"] == len(calib) and 0 < cal["decoder_feeds"] <= 512
    assert cal["decoder_recording"]["decode_strategy"] == "beam" and cal["roles"]["encoder"]["feeds"] == len(calib)
    artifact = json.loads(json.dumps(avx2.artifact()))
    assert artifact["preset"] == "cpu-avx2" and set(artifact["ranges"]) == {"encoder", "step"}
    for role, ranges in avx2.ranges.items():
        assert ranges and all(lo <= hi for lo, hi in ranges.values()), role


def test_workdir_keeps_the_intermediate_graphs(acort, calib, tmp_path) -> None:
    result = quantize_int8(
        acort.fp32, acort.spec, iter(calib[:2]), acort.cfg(), STATIC_VNNI, workdir=tmp_path, progress=False
    )
    names = {p.name for p in tmp_path.iterdir()}
    assert {"encoder.int8.onnx", "step.int8.onnx", "step.fp32-pre.onnx", "int8_calibration.json"} <= names
    assert onnx.load(str(tmp_path / "step.int8.onnx")).SerializeToString() == result.models["step"].SerializeToString()
    assert result.calibration["encoder_feeds"] == 2  # a one-shot iterator was kept for the second pass
    full_range = max(int(np.abs(w.astype(np.int32)).max()) for w in weight_arrays(result.models["step"]))
    assert full_range == 127  # VNNI: no reduce_range


# -- exclusions ------------------------------------------------------------------------------------------------------
def test_excluded_nodes_and_op_types_stay_float(acort, calib) -> None:
    step = acort.fp32["step"]
    constants = {t.name for t in step.graph.initializer}
    weight_matmuls = [n.name for n in step.graph.node if n.op_type == "MatMul" and n.input[1] in constants]
    first, glob_target = weight_matmuls[0], weight_matmuls[-1]
    glob = glob_target[:-1] + "?"
    result = quantize_int8(
        acort.fp32,
        acort.spec,
        calib[:2],
        acort.cfg(),
        STATIC_AVX2,
        exclude_nodes=[f"step:{first}", glob],
        exclude_op_types=["step:Gemm"],
        progress=False,
    )
    model = result.models["step"]
    by_name = {n.name: n for n in model.graph.node}
    excluded = result.calibration["roles"]["step"]["excluded_nodes"]
    assert first in excluded and glob_target in excluded
    assert not dq_fed(model, by_name[first]) and not dq_fed(model, by_name[glob_target])
    assert all(not dq_fed(model, n) for n in model.graph.node if n.op_type == "Gemm")
    assert result.calibration["roles"]["step"]["excluded_op_types"] == ["Gemm"]
    assert "Gemm" in result.calibration["roles"]["encoder"]["op_types"]  # the prefix limited it to the step graph
    other = [n for n in weight_matmuls if n not in (first, glob_target)]
    assert any(dq_fed(model, by_name[n]) for n in other)


def test_an_exclusion_matching_nothing_is_an_error(acort, calib) -> None:
    with pytest.raises(CalibrationError, match=r"\['nodee_MatMul_\*'\] match no node"):
        quantize_int8(acort.fp32, acort.spec, calib, acort.cfg(), STATIC_AVX2, exclude_nodes=["nodee_MatMul_*"])


# -- bad calibration sets --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("empty", [[], iter(())], ids=["list", "generator"])
def test_an_empty_calibration_set_is_an_error(acort, empty) -> None:
    with pytest.raises(CalibrationError, match="empty calibration set"):
        quantize_int8(acort.fp32, acort.spec, empty, acort.cfg(), STATIC_AVX2, progress=False)


def test_feed_names_must_match_the_encoder_inputs(acort, calib) -> None:
    bad = [{k: v for k, v in calib[0].items() if k != "feature_mask"}]
    with pytest.raises(CalibrationError, match=r"#0: names do not match.*missing \['feature_mask'\]"):
        quantize_int8(acort.fp32, acort.spec, bad, acort.cfg(), STATIC_AVX2, progress=False)
    extra = [{**calib[0], "pixel_values": np.zeros((4, 3, 8, 8), np.float32)}]
    with pytest.raises(CalibrationError, match=r"unexpected \['pixel_values'\]"):
        quantize_int8(acort.fp32, acort.spec, extra, acort.cfg(), STATIC_AVX2, progress=False)


def test_missing_or_unknown_roles_are_an_error(acort, calib) -> None:
    with pytest.raises(CalibrationError, match=r"lacks role\(s\) \['step'\]"):
        quantize_int8({"encoder": acort.fp32["encoder"]}, acort.spec, calib, acort.cfg(), STATIC_AVX2)
    with pytest.raises(CalibrationError, match=r"quantise \['refine'\] with quantize_graph"):
        quantize_int8({**acort.fp32, "refine": acort.fp32["step"]}, acort.spec, calib, acort.cfg(), STATIC_AVX2)


# -- one graph, and the range cache ----------------------------------------------------------------------------------
def tiny_graph() -> onnx.ModelProto:
    """x (B, 8) -> MatMul -> Relu -> MatMul -> Softmax -> y (B, 4)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["z"], name="fc2"),
        helper.make_node("Softmax", ["z"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4])],
        [w1, w2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def tiny_feeds(count: int, seed: int = 0, varying: bool = False) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((2 + (i % 3 if varying else 0), 8)).astype(np.float32)} for i in range(count)]


def test_range_cache_is_written_then_reused_without_calibrating(tmp_path) -> None:
    cache = tmp_path / "ranges.json"
    first = quantize_graph(tiny_graph(), CalibrationSource(tiny_feeds(5), cache=cache), STATIC_AVX2)
    assert cache.is_file() and first.info["cache"] == {"path": str(cache), "reused": False} and first.info["feeds"] == 5

    def never():
        raise AssertionError("the feeds must not be read when the cache exists")
        yield  # pragma: no cover

    second = quantize_graph(tiny_graph(), CalibrationSource(never(), cache=cache), STATIC_AVX2)
    assert second.info["cache"]["reused"] and second.info["feeds"] == 0
    assert second.ranges == first.ranges
    assert second.model.graph.SerializeToString() == first.model.graph.SerializeToString()
    assert set(first.ranges) >= {"x", "r"}


def test_a_tensorrt_table_is_not_an_onnxruntime_range_cache(tmp_path) -> None:
    (tmp_path / "t.cache").write_text("TRT-100300-EntropyCalibration2\nx: 3c010204\n")  # an old bundle's table
    with pytest.raises(CalibrationError, match="not an ONNX Runtime tensor-range cache"):
        quantize_graph(tiny_graph(), CalibrationSource(tiny_feeds(2), cache=tmp_path / "t.cache"), STATIC_AVX2)


def test_quantize_graph_errors() -> None:
    with pytest.raises(CalibrationError, match="empty calibration set"):
        quantize_graph(tiny_graph(), [], STATIC_AVX2)
    with pytest.raises(CalibrationError, match=r"missing \['x'\]"):
        quantize_graph(tiny_graph(), [{"y": np.zeros((2, 8), np.float32)}], STATIC_AVX2)
    with pytest.raises(CalibrationError, match="leaves nothing to quantise"):
        quantize_graph(tiny_graph(), tiny_feeds(1), STATIC_AVX2, exclude_op_types=["MatMul", "Gemm"])
    with pytest.raises(CalibrationError, match=r"\['fc9'\] match no node"):
        quantize_graph(tiny_graph(), tiny_feeds(1), STATIC_AVX2, exclude_nodes=["fc9"])


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_histogram_calibration_accepts_feeds_of_varying_shape(method: str) -> None:
    preset = get_preset("cpu-avx2").replace(name=f"test-{method}", roles={"step": RolePolicy(("MatMul",), method)})
    result = quantize_graph(tiny_graph(), (f for f in tiny_feeds(6, varying=True)), preset, "step")
    assert result.info["feeds"] == 6 and result.info["onnxruntime_method"].lower() == method
    with OnnxRuntimeSession(result.model) as runtime:
        assert runtime.infer({"x": np.ones((3, 8), np.float32)})["y"].shape == (3, 4)


# -- presets ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cpuinfo", "machine", "preset"),
    [
        ("flags\t\t: fpu sse4_2 avx2 fma f16c\n", "x86_64", "cpu-avx2"),
        ("flags\t\t: avx2 avx512f avx512bw avx512_vnni\n", "x86_64", "cpu-vnni"),
        ("flags\t\t: avx2 avx_vnni\n", "AMD64", "cpu-vnni"),
        ("", "x86_64", "cpu-avx2"),
        ("Features\t: fp asimd asimddp\n", "aarch64", "arm64"),
        ("", "arm64", "arm64"),
    ],
)
def test_cpu_auto_reads_the_cpu_flags(cpuinfo: str, machine: str, preset: str) -> None:
    assert detect_cpu_preset(cpuinfo, machine) == preset


def test_preset_registry() -> None:
    assert {"tensorrt", "cpu-avx2", "cpu-vnni", "arm64", "cpu-auto"} <= set(list_presets())
    assert get_preset("cpu-auto").name == detect_cpu_preset()
    with pytest.raises(CalibrationError, match="unknown INT8 preset 'gpu'"):
        get_preset("gpu")
    trt = get_preset("tensorrt")
    assert trt.activation_type == "int8" and trt.activation_symmetric and trt.per_channel and not trt.reduce_range
    assert get_preset("cpu-avx2").reduce_range and get_preset("cpu-avx2").activation_type == "uint8"
    for name in ("tensorrt", "cpu-avx2", "cpu-vnni", "arm64"):
        for role in ("encoder", "step"):
            policy = get_preset(name).role(role)
            assert "Softmax" not in policy.op_types and policy.weight_matmuls_only
        assert get_preset(name).role("step").method == "minmax"
    with pytest.raises(CalibrationError, match="method"):
        RolePolicy(("MatMul",), method="kl")
    with pytest.raises(CalibrationError, match="activation_type"):
        QuantPreset(name="x", description="", activation_type="int4")


def test_a_word_vocabulary_model_with_separate_values(ort_word, region_feeds) -> None:
    result = quantize_int8(
        ort_word.fp32, ort_word.spec, region_feeds(3, seed=2), ort_word.cfg("beam", beam_size=2), progress=False
    )
    assert result.preset == detect_cpu_preset()
    test = region_feeds(3, seed=8)
    cfg = ort_word.cfg("greedy")
    refs = [["w1 w2 w3", "w4 w5"]] * 12
    with (
        create_onnxruntime_step_model(ort_word.fp32["encoder"], ort_word.fp32["step"]) as ref,
        create_onnxruntime_step_model(result.models["encoder"], result.models["step"]) as cand,
    ):
        report = compare_decoders(ref, cand, test, refs, ort_word.vocab, cfg)
    assert report["images"] == 12 and report["token_agreement_pct"] >= 70.0
    assert np.isfinite(report["cider_d_delta"])
    # separate values: a value cache beside each key cache, one of each per decoder position
    assert set(ort_word.spec.state_names) == {
        "memory_bias",
        "cross_k",
        "cross_v",
        "self_k0",
        "self_k1",
        "self_v0",
        "self_v1",
    }


# -- length-controllable models (LaBERT §3.1) ------------------------------------------------------------------------
def test_feeds_without_levels_cycle_over_every_level() -> None:
    from edgecap.workshop.export.calibration.calib_utils import LENGTH_LEVEL, with_levels

    feeds = [{"features": np.zeros((3, 2, 4), np.float32)}, {"features": np.zeros((2, 2, 4), np.float32)}]
    given = {"features": np.zeros((2, 2, 4), np.float32), LENGTH_LEVEL: np.array([4, 4])}
    source = with_levels(CalibrationSource([*feeds, given], name="feeds"), 4)
    assert source.reiterable and source.name == "feeds"
    for _ in range(2):  # re-iterable, and the same levels on every pass
        assert [f[LENGTH_LEVEL].tolist() for f in source] == [[1, 2, 3], [2, 3], [4, 4]]
    assert all(f[LENGTH_LEVEL].dtype == np.int64 for f in source)
    assert source.count == 3
    one_shot = with_levels(CalibrationSource(iter(feeds)), 2)
    assert not one_shot.reiterable and [f[LENGTH_LEVEL].tolist() for f in one_shot] == [[1, 2, 1], [2, 1]]


def _conv_block() -> onnx.ModelProto:
    """``x -> Conv -> Clip(0, 6) -> Conv -> Add(x) -> Relu``: a ReLU6 right after a conv (an integer conv's epilogue)
    and a ReLU after a residual add (not one)."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.5, (3, 4, 1, 1)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"], name="relu6"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
        helper.make_node("Add", ["c2", "x"], ["a"], name="residual"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_activation_right_after_a_conv_is_folded_into_it_and_others_stay_float():
    """The encoder role folds ReLU6/ReLU into the conv they follow (its output quantised over the clipped range, as
    integer conv kernels apply it); a ReLU after a residual add keeps its float input."""
    feeds = [{"x": np.random.default_rng(i).normal(0, 1, (2, 3, 8, 8)).astype(np.float32)} for i in range(4)]
    result = quantize_graph(_conv_block(), feeds, "cpu-vnni", role="encoder")
    ops = {n.name: n for n in result.model.graph.node}
    made_by = producers(result.model)
    assert "relu6" not in ops  # folded: conv1's output is quantised over [0, 6]
    assert all(made_by[ops[c].input[0]].op_type == "DequantizeLinear" for c in ("conv1", "conv2"))
    assert made_by[ops["relu"].input[0]].op_type == "Add"  # float, not fake-quantised
    conv1_out = ops["conv1"].output[0]
    q1 = next(n for n in result.model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == conv1_out)
    scale = initializers(result.model)[q1.input[1]]
    assert float(scale) == pytest.approx(6.0 / 255, rel=0.05)  # the ReLU6 range, not the raw conv output's
    float_policy = dataclasses.replace(ENCODER_ROLE, fused_activations=())
    plain = quantize_graph(
        _conv_block(), feeds, get_preset("cpu-vnni").replace(roles={"encoder": float_policy}), role="encoder"
    )
    assert "relu6" in {n.name for n in plain.model.graph.node}  # without the fold the Clip stays


def test_int8_export_refuses_an_onnxruntime_older_than_it_is_tested_with(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime

    from edgecap.workshop.export.calibration import onnxruntime_utils

    release = onnxruntime_utils.release_numbers
    assert release("1.32.0") == (1, 32, 0) and release("1.18.1+cu118") == (1, 18, 1)
    assert release("1.33.0rc1") == (1, 33, 0)
    monkeypatch.setattr(onnxruntime, "__version__", "1.30.0")
    with pytest.raises(
        ImportError, match=r"INT8 export needs onnxruntime >= 1\.32.*running bundles needs only >= 1\.18"
    ):
        onnxruntime_utils.import_quantization()
