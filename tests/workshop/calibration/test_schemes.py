"""The calibration-free step schemes (``dynamic``, ``weight-only``): selection per preset, the ops they leave in the
step graph, parity and decoding against FP32, the standard-ops rule, and bad configurations."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from edgecap.runtime.backends.onnxruntime.session import ROW_COUPLED_SCHEMES, OnnxRuntimeSession  # noqa: E402
from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model  # noqa: E402
from edgecap.workshop.export.calibration import (  # noqa: E402
    CalibrationError,
    RolePolicy,
    compare_decoders,
    get_preset,
    quantize_graph,
    quantize_int8,
    record_decoder_feeds,
)
from edgecap.workshop.export.calibration.presets import SCHEMES, TRANSFORMER_ROLE  # noqa: E402
from edgecap.workshop.export.calibration.schemes import float_weight_matmuls  # noqa: E402

#: scheme -> (bits, the op each weight MatMul becomes)
CASES = {"dynamic": (8, "MatMulInteger"), "weight-only-8": (8, "MatMulNBits"), "weight-only-4": (4, "MatMulNBits")}


def _preset(case: str):
    """The scheme on the preset this CPU resolves to: ``cpu-vnni``'s full-range weights saturate AVX2's u8×s8 kernel
    (an AVX2-only CPU needs ``cpu-avx2``'s reduced range), so a fixed preset made this check depend on the CPU."""
    scheme = "dynamic" if case == "dynamic" else "weight-only"
    bits = CASES[case][0]
    options = {"bits": bits} if scheme == "dynamic" else {"bits": bits, "block_size": 16}
    return get_preset("cpu-auto").with_scheme("step", scheme, **options).replace(name=f"test-{case}")


def ops(model) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


@pytest.fixture(scope="module")
def calib(region_feeds):
    return region_feeds(4, batch=4, seed=1)


@pytest.fixture(scope="module")
def quantized(acort, calib):
    return {
        case: quantize_int8(acort.fp32, acort.spec, calib, acort.cfg("greedy"), _preset(case), progress=False)
        for case in CASES
    }


@pytest.fixture(scope="module")
def step_feeds(acort, region_feeds):
    fp32 = acort.fp32
    with create_onnxruntime_step_model(fp32["encoder"], fp32["step"]) as ref:
        return record_decoder_feeds(
            ref, region_feeds(2, batch=4, seed=5), acort.cfg("beam", beam_size=2), acort.spec.state_names
        ).feeds


# -- selection -------------------------------------------------------------------------------------------------------
def test_every_builtin_preset_names_a_known_scheme_per_role_and_tensorrt_stays_static() -> None:
    for name in ("cpu-avx2", "cpu-vnni", "arm64", "tensorrt"):
        preset = get_preset(name)
        assert preset.role("encoder").scheme == "static"  # the encoder always gets calibrated QDQ
        assert preset.role("step").scheme in SCHEMES
        assert set(preset.summary()["schemes"]) == set(preset.roles)
    trt = get_preset("tensorrt")
    assert {p.scheme for p in trt.roles.values()} == {"static"} and trt.standard_ops_only


def test_the_x86_presets_default_to_a_static_step_whose_rows_are_independent() -> None:
    """A caption must not depend on its batch: the default presets' steps never use a row-coupled scheme."""
    for name in ("cpu-avx2", "cpu-vnni", "arm64", "tensorrt"):
        assert get_preset(name).role("step").scheme == "static" not in ROW_COUPLED_SCHEMES
    assert "dynamic" in ROW_COUPLED_SCHEMES and "weight-only" not in ROW_COUPLED_SCHEMES


def test_with_scheme_changes_one_role_and_keeps_static_available() -> None:
    vnni = get_preset("cpu-vnni")
    static = vnni.with_scheme("step", "static")
    assert static.role("step").scheme == "static" and static.role("encoder") == vnni.role("encoder")
    w4 = vnni.with_scheme("step", "weight-only", bits=4, block_size=32)
    assert w4.role("step").describe() == {"scheme": "weight-only", "bits": 4, "block_size": 32, "accuracy_level": 4}


# -- graphs ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
def test_step_weights_become_integer_matmuls_and_no_float_weight_matmul_is_left(quantized, case) -> None:
    result = quantized[case]
    step = result.models["step"]
    onnx.checker.check_model(step)
    counts = ops(step)
    assert counts[CASES[case][1]] > 0
    assert float_weight_matmuls(step) == []  # every weight MatMul is quantised
    assert counts["MatMul"] > 0  # attention's activation x activation matmuls stay float
    assert counts["QuantizeLinear"] == 0  # no calibrated QDQ in the step graph
    encoder = ops(result.models["encoder"])
    assert encoder["QuantizeLinear"] > 0 and encoder["MatMulNBits"] == encoder["MatMulInteger"] == 0
    info = result.calibration["roles"]["step"]
    assert info["scheme"] == _preset(case).role("step").scheme and info["bits"] == CASES[case][0]
    assert info["quantized_ops"][CASES[case][1]] == counts[CASES[case][1]] and info["feeds"] == 0
    domains = {n.domain for n in step.graph.node}
    assert ("com.microsoft" in domains) == (case != "dynamic")
    assert info["portable"] == (case == "dynamic")


def test_4_bit_weights_are_smaller_than_8_bit(quantized) -> None:
    sizes = {case: quantized[case].models["step"].ByteSize() for case in CASES}
    assert sizes["weight-only-4"] < sizes["weight-only-8"]


@pytest.mark.parametrize("case", list(CASES))
def test_step_logprobs_stay_close_to_fp32_and_decoding_runs(quantized, acort, step_feeds, region_feeds, case) -> None:
    step = quantized[case].models["step"]
    agree = total = 0
    errors = []
    with OnnxRuntimeSession(acort.fp32["step"]) as ref, OnnxRuntimeSession(step) as cand:
        for feed in step_feeds:
            a, b = ref.infer(feed)["logprobs"], cand.infer(feed)["logprobs"]
            errors.append(np.abs(np.exp(a) - np.exp(b)).max())
            agree, total = agree + int((a.argmax(-1) == b.argmax(-1)).sum()), total + a.shape[0]
    tolerance = 0.1 if CASES[case][0] == 8 else 0.25  # probabilities; 4-bit weights are coarser
    assert max(errors) < tolerance
    assert agree / total >= (0.9 if CASES[case][0] == 8 else 0.75)
    fp32 = acort.fp32
    cfg = acort.cfg("beam", beam_size=2)
    with (
        create_onnxruntime_step_model(fp32["encoder"], fp32["step"]) as ref,
        create_onnxruntime_step_model(quantized[case].models["encoder"], step) as cand,
    ):
        report = compare_decoders(ref, cand, region_feeds(2, batch=4, seed=9), None, acort.vocab, cfg)
    assert report["images"] == 8 and report["token_agreement_pct"] >= 60.0


def test_only_a_dynamic_step_lets_one_row_change_the_others(quantized, acort, calib, step_feeds) -> None:
    """Static scales are fixed and ``MatMulNBits`` quantises each row's blocks alone, so another token in the last
    row leaves every other row's log-probs bit for bit; ``DynamicQuantizeLinear``'s one scale per call does not
    (which is why ONNX Runtime decodes a dynamic step image by image, ``ROW_COUPLED_SCHEMES``)."""
    static = quantize_int8(acort.fp32, acort.spec, calib, acort.cfg("greedy"), "cpu-vnni", progress=False)
    steps = {"static": static.models["step"], **{case: quantized[case].models["step"] for case in CASES}}
    changed = {}
    for case, step in steps.items():
        changed[case] = 0
        with OnnxRuntimeSession(step) as runtime:
            for feed in step_feeds:
                before = runtime.infer(feed)["logprobs"]
                for token in (0, 5, acort.vocab.size - 1):
                    tokens = feed["tokens"].copy()
                    tokens[-1] = token
                    after = runtime.infer({**feed, "tokens": tokens})["logprobs"]
                    changed[case] += int(not np.array_equal(before[:-1], after[:-1]))
    assert changed["dynamic"] > 0
    assert {case: n for case, n in changed.items() if case != "dynamic"} == dict.fromkeys(set(steps) - {"dynamic"}, 0)


def test_an_uncalibrated_scheme_needs_no_feeds(acort) -> None:
    graph = quantize_graph(acort.fp32["step"], [], _preset("weight-only-8"), role="step")
    assert graph.ranges == {} and ops(graph.model)["MatMulNBits"] > 0


def test_excluded_nodes_stay_float_matmuls(acort) -> None:
    weights = float_weight_matmuls(acort.fp32["step"])
    first = weights[0]
    graph = quantize_graph(acort.fp32["step"], [], _preset("dynamic"), role="step", exclude_nodes=[first])
    assert float_weight_matmuls(graph.model) == [first]


def test_excluded_op_types_stay_float_under_uncalibrated_schemes(acort) -> None:
    """``exclude_op_types`` means the same for every scheme: the step's output ``Gemm`` keeps float weights (as a
    float MatMul + Add under the Gemm's name)."""
    gemms = [n.name for n in acort.fp32["step"].graph.node if n.op_type == "Gemm"]
    assert gemms, "the acort step graph has its output projection as a Gemm"
    for scheme in ("dynamic", "weight-only-8"):
        graph = quantize_graph(acort.fp32["step"], [], _preset(scheme), role="step", exclude_op_types=["Gemm"])
        assert set(gemms) <= set(float_weight_matmuls(graph.model)), scheme
        assert graph.info["op_types"] == ["MatMul"]


def test_a_shared_weight_restored_for_an_excluded_node_leaves_no_dead_nodes() -> None:
    """One initialiser read by two MatMuls (ACORT's sharing); excluding one must neither fake-quantise it nor leave
    an unread DequantizeLinear behind."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="first"),
             helper.make_node("MatMul", ["h", "w"], ["y"], name="second")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], [w],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = quantize_graph(model, [], _preset("dynamic"), role="step", exclude_nodes=["second"]).model
    read = {i for n in out.graph.node for i in n.input} | {o.name for o in out.graph.output}
    assert all(any(o in read for o in n.output) for n in out.graph.node)
    second = next(n for n in out.graph.node if n.name == "second")
    assert second.op_type == "MatMul" and second.input[1] in {t.name for t in out.graph.initializer}
    x = rng.standard_normal((2, 16)).astype(np.float32)
    with OnnxRuntimeSession(out, name="q", providers="cpu") as runtime:
        got = runtime.infer({"x": x})["y"]
    ref = (x @ numpy_helper.to_array(w)) @ numpy_helper.to_array(w)
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()


# -- rules and errors ------------------------------------------------------------------------------------------------
def test_a_standard_ops_only_preset_refuses_contrib_schemes() -> None:
    trt = get_preset("tensorrt")
    with pytest.raises(CalibrationError, match="standard ONNX ops only"):
        trt.replace(provider="cpu").with_scheme("step", "weight-only")
    with pytest.raises(CalibrationError, match="TensorRT runs only static"):
        trt.with_scheme("step", "dynamic")
    portable = trt.replace(name="portable-dynamic", provider="cpu").with_scheme("step", "dynamic")
    assert portable.role("step").scheme == "dynamic"  # MatMulInteger/DynamicQuantizeLinear are standard ONNX


def test_a_standard_ops_only_dynamic_graph_has_no_contrib_ops(acort) -> None:
    from edgecap.workshop.export.graph import non_portable_nodes

    preset = get_preset("tensorrt").replace(name="portable-dynamic", provider="cpu").with_scheme("step", "dynamic")
    graph = quantize_graph(acort.fp32["step"], [], preset, role="step")
    assert non_portable_nodes(graph.model) == [] and ops(graph.model)["MatMulInteger"] > 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"scheme": "int4"}, "scheme must be one of"),
        ({"scheme": "weight-only", "bits": 2}, r"bits must be one of \[4, 8\]"),
        ({"scheme": "dynamic", "bits": 4}, r"bits must be one of \[8\]"),
        ({"scheme": "weight-only", "block_size": 48}, "power of two"),
        ({"scheme": "weight-only", "block_size": 8}, "power of two"),
        ({"scheme": "weight-only", "accuracy_level": 5}, "accuracy_level"),
        ({"scheme": "dynamic", "op_types": ("Gemm",)}, "leave MatMul out"),
    ],
)
def test_bad_scheme_configs_are_clear_errors(changes, message) -> None:
    with pytest.raises(CalibrationError, match=message):
        RolePolicy(**{"op_types": TRANSFORMER_ROLE.op_types, **changes})
