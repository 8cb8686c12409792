"""OnnxRuntimeSession and its StepModel: providers, threads, I/O paths, lazy import, and decode-level parity with torch.

The decode test is the end-to-end contract: the *same* ``edgecap.runtime.decoding.decode`` on torch
(``TorchStepModel``) and
on ONNX Runtime fp32 gives identical beam-3 token sequences and scores within 1e-4.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from edgecap.runtime.backends import RuntimeInputError, RuntimeStateError, get_runtime_class, load_runtime
from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeProviderError, OnnxRuntimeSession, resolve_providers
from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model
from edgecap.runtime.backends.threads import SPIN_KEYS, WIDE_FROM_ROWS, WidePlan, plan_threads
from edgecap.runtime.decoding import decode
from edgecap.workshop.torch_runtime.runtime import TorchStepModel
from tests.workshop.export.helpers import AR_TEST_CONFIGS, TEST_CONFIGS, decode_cfg, exported, random_images, tiny_model

CPU, CUDA, TRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"


def _step_feed(config: str, batch: int = 3, past: int = 2) -> dict[str, np.ndarray]:
    spec = exported(config).spec
    graph = spec.graph("step")
    made = graph.make_inputs(spec.sizes_for(graph, {"batch": batch, "past": past}), torch.Generator().manual_seed(1))
    return {n: made[n].numpy() for n in graph.inputs}


# -- providers and session settings --------------------------------------------------------------------------------
def test_resolve_providers() -> None:
    assert resolve_providers(None, [CPU]) == [CPU]
    assert resolve_providers(None, ["AzureExecutionProvider", CPU, CUDA, TRT]) == [TRT, CUDA, CPU]
    assert resolve_providers(["cuda"], [CPU, CUDA, TRT]) == [CUDA, CPU]  # explicit choice, CPU as the fallback
    assert resolve_providers("CPU", [CPU]) == [CPU]
    with pytest.raises(OnnxRuntimeProviderError, match="not available"):
        resolve_providers(["tensorrt"], [CPU])


def test_registered_and_lazily_imported() -> None:
    assert get_runtime_class("onnxruntime") is OnnxRuntimeSession
    code = (
        "import sys, edgecap, edgecap.runtime.backends, edgecap.workshop.export, edgecap.workshop.export.spec; "
        "edgecap.runtime.backends.list_runtimes(); "
        "assert 'onnxruntime' not in sys.modules, 'onnxruntime imported eagerly'; "
        "assert 'onnx' not in sys.modules, 'onnx imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_session_settings_and_lifecycle() -> None:
    model = exported(TEST_CONFIGS[0]).model("step")
    runtime = load_runtime("onnxruntime", model, intra_op_threads=1, inter_op_threads=1, providers=["cpu"])
    assert runtime.array_type == "numpy" and not runtime.io_binding
    with pytest.raises(RuntimeStateError):
        runtime.infer({})
    with runtime:
        session = runtime.session
        options = session.get_session_options()
        assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)
        assert runtime.providers_in_use() == [CPU]
        assert runtime.metadata()["graph_role"] == "step"
        meta = runtime.input_metadata()
        assert meta["tokens"].dtype == "int64" and meta["tokens"].shape == ("batch",)
        assert meta["self_k0"].shape[2] == "past" and meta["memory_bias"].dtype == "float32"
        feed = _step_feed(TEST_CONFIGS[0])
        first = runtime.infer(feed)
        runtime.activate()  # no-op: the session is created once
        assert runtime.session is session
        second = runtime.infer(feed)
        assert set(first) == set(runtime.output_names) and np.array_equal(first["logprobs"], second["logprobs"])
        assert runtime.last_latency_s is not None and runtime.inference_count == 2


def test_bad_inputs_get_named_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="missing.onnx"):
        OnnxRuntimeSession(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="intra_op_threads"):
        OnnxRuntimeSession(b"", intra_op_threads=-1)
    with pytest.raises(OnnxRuntimeProviderError, match="provider_options"):
        OnnxRuntimeSession(b"", provider_options={"cuda": {}})
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(RuntimeInputError, match="could not load"), OnnxRuntimeSession(bad):
        pass
    feed = _step_feed(TEST_CONFIGS[0])
    with OnnxRuntimeSession(exported(TEST_CONFIGS[0]).model("step")) as runtime:
        with pytest.raises(RuntimeInputError, match="'tokens' has dtype int32"):
            runtime.infer({**feed, "tokens": feed["tokens"].astype(np.int32)})
        with pytest.raises(RuntimeInputError, match="missing \\['tokens'\\]"):
            runtime.infer({k: v for k, v in feed.items() if k != "tokens"})
        with pytest.raises(RuntimeInputError, match="rank"):
            runtime.infer({**feed, "self_k0": feed["self_k0"][0]})


def test_the_plain_path_runs_through_the_public_session_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every numpy-path inference is one public ``InferenceSession.run`` call, after the feed checks; unchecked torch
    inputs are converted first."""
    model = exported(TEST_CONFIGS[0]).model("step")
    feed = _step_feed(TEST_CONFIGS[0])
    with OnnxRuntimeSession(model) as runtime:
        calls: list[list[str]] = []
        real = runtime.session.run

        def counting(output_names, input_feed, *args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(sorted(input_feed))
            return real(output_names, input_feed, *args, **kwargs)

        monkeypatch.setattr(runtime.session, "run", counting)
        got = runtime.infer(feed)
        unchecked = runtime.infer({k: torch.from_numpy(v) for k, v in feed.items()}, check_inputs=False)
        with pytest.raises(RuntimeInputError, match="'tokens' has dtype int32"):  # the checks run first
            runtime.infer({**feed, "tokens": feed["tokens"].astype(np.int32)})
        assert calls == [sorted(feed)] * 2
    assert list(got) == list(unchecked)
    for name, value in got.items():
        np.testing.assert_array_equal(unchecked[name], value)


def test_fast_feed_check_defers_every_mismatch_to_the_full_check() -> None:
    """The fast path only ever accepts; anything off (a fixed size, dtype, rank, name, a torch tensor) gets the full
    check's named error or passes it."""
    feed = _step_feed(TEST_CONFIGS[0])
    with OnnxRuntimeSession(exported(TEST_CONFIGS[0]).model("step")) as runtime:
        runtime.check_feed(feed)
        heads = feed["self_k0"].shape[1]
        with pytest.raises(RuntimeInputError, match=f"'self_k0' has size {heads - 1} on axis 1, expected {heads}"):
            runtime.check_feed({**feed, "self_k0": feed["self_k0"][:, 1:]})
        with pytest.raises(RuntimeInputError, match="'memory_bias' has dtype float64"):
            runtime.check_feed({**feed, "memory_bias": feed["memory_bias"].astype(np.float64)})
        with pytest.raises(RuntimeInputError, match=r"missing \['tokens'\], unexpected \['token'\]"):
            runtime.check_feed({**{k: v for k, v in feed.items() if k != "tokens"}, "token": feed["tokens"]})
        runtime.check_feed({**feed, "tokens": torch.from_numpy(feed["tokens"])})  # torch: the full check passes it


def test_step_model_checks_the_feed_of_every_step() -> None:
    """A bad token or state feed fails with a named error at any step, not only the first."""
    result = exported(TEST_CONFIGS[0])
    with create_onnxruntime_step_model(**result.runtime_models("fp32")) as step_model:
        state = step_model.encode(random_images(1))
        state = step_model.select(state, np.zeros(3, dtype=np.int64))
        tokens = np.full(3, 5, dtype=np.int64)
        for _ in range(2):
            logprobs, state = step_model.step(tokens, state)
        assert isinstance(logprobs, np.ndarray) and logprobs.dtype == np.float32 and logprobs.shape[0] == 3
        with pytest.raises(RuntimeInputError, match="'tokens' has rank 2"):
            step_model.step(tokens[:, None], state)
        with pytest.raises(RuntimeInputError, match="'self_k0' has rank"):
            step_model.step(tokens, {**state, "self_k0": state["self_k0"][0]})
        logprobs_again, _ = step_model.step(tokens, state)  # the state is untouched by the failed calls
    np.testing.assert_array_equal(logprobs_again, _plain_step_logprobs(result, state, tokens))


def _plain_step_logprobs(result, state, tokens):  # type: ignore[no-untyped-def]
    """The step graph run through the public InferenceSession.run wrapper."""
    with OnnxRuntimeSession(result.runtime_models("fp32")["step"]) as runtime:
        return runtime.infer({"tokens": tokens, **state})["logprobs"]


def test_io_binding_path_matches_plain_run() -> None:
    """The binding path (torch tensors by pointer, outputs back through DLPack) — what CUDA uses — run on CPU."""
    model = exported(TEST_CONFIGS[0]).model("step")
    feed = _step_feed(TEST_CONFIGS[0])
    with OnnxRuntimeSession(model) as plain, OnnxRuntimeSession(model, io_binding=True) as bound:
        assert bound.array_type == "torch"
        expected = plain.infer(feed)
        got = bound.infer({k: torch.from_numpy(v) for k, v in feed.items()})
        got_np = bound.infer(feed)  # numpy feeds are accepted too
    for name, value in expected.items():
        assert isinstance(got[name], torch.Tensor)
        np.testing.assert_array_equal(got[name].numpy(), value)
        np.testing.assert_array_equal(got_np[name].numpy(), value)


# -- decoding on ONNX Runtime ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", AR_TEST_CONFIGS)
def test_beam_search_identical_to_torch(config: str) -> None:
    """Same decode() on torch and ONNX Runtime fp32: identical beam-3 tokens, scores within 1e-4 (6 images, batched)."""
    model, result = tiny_model(config), exported(config)
    cfg = decode_cfg(config, min_len=3, n_best=3)
    images = random_images(6)
    expected = decode(TorchStepModel(model), images, cfg)
    with create_onnxruntime_step_model(**result.runtime_models("fp32"), intra_op_threads=1) as step_model:
        assert step_model.state_names == result.spec.state_names  # read from the graph's metadata
        got = decode(step_model, images, cfg)
        single = decode(step_model, {k: v[:1] for k, v in images.items()}, cfg)  # batch 1 (B = beams = 3)
    assert len(got) == 6
    assert any(len(h.tokens) > 3 for hyps in got for h in hyps)
    for want, have in zip(expected, got, strict=True):
        assert [h.tokens for h in have] == [h.tokens for h in want]
        for h_want, h_have in zip(want, have, strict=True):
            assert h_have.score == pytest.approx(h_want.score, abs=1e-4)
            assert h_have.finished == h_want.finished
    assert [h.tokens for h in single[0]] == [h.tokens for h in expected[0]]


def test_beam_search_with_io_binding_and_fp16() -> None:
    config = TEST_CONFIGS[0]
    model, result = tiny_model(config), exported(config)
    cfg = decode_cfg(config, min_len=2)
    images = random_images(3, seed=11)
    expected = decode(TorchStepModel(model), images, cfg)
    with create_onnxruntime_step_model(**result.runtime_models("fp32"), io_binding=True) as step_model:
        bound = decode(step_model, images, cfg)
    assert [h[0].tokens for h in bound] == [h[0].tokens for h in expected]
    with create_onnxruntime_step_model(**result.runtime_models("fp16")) as step_model:
        half = decode(step_model, images, cfg)
    assert all(h[0].tokens for h in half)
    for want, have in zip(expected, half, strict=True):  # fp16 is close, not identical: compare scores loosely
        assert have[0].score == pytest.approx(want[0].score, abs=0.5)


def test_step_model_rejects_missing_decode_inputs() -> None:
    result = exported(TEST_CONFIGS[0])
    images = random_images(2)
    del images["feature_mask"]
    with (
        create_onnxruntime_step_model(**result.runtime_models("fp32")) as step_model,
        pytest.raises(RuntimeInputError, match="feature_mask"),
    ):
        decode(step_model, images, decode_cfg(TEST_CONFIGS[0]))


@pytest.mark.parametrize(
    ("provider", "held", "int8", "expected"),
    [
        ("CPUExecutionProvider", ("fp32", "fp16", "int8"), {"preset": "cpu-avx2"}, "int8"),  # safe on every x86 CPU
        ("CPUExecutionProvider", ("fp32", "fp16"), None, "fp32"),  # FP16 is never chosen on CPU
        ("CUDAExecutionProvider", ("fp32", "fp16", "int8"), {"preset": "cpu-avx2"}, "fp16"),
        ("CUDAExecutionProvider", ("fp32",), None, "fp32"),
        ("TensorrtExecutionProvider", ("fp32", "fp16", "int8"), {"preset": "tensorrt"}, "int8"),
        ("TensorrtExecutionProvider", ("fp32", "fp16", "int8"), {"preset": "cpu-avx2"}, "fp16"),
        ("OpenVINOExecutionProvider", ("fp32", "fp16"), None, "fp32"),  # not in the table: FP32
    ],
)
def test_auto_precision_follows_the_provider_table(
    provider: str, held: tuple[str, ...], int8: dict | None, expected: str
) -> None:
    from edgecap.runtime.backends.onnxruntime.providers import auto_precision as _auto_precision

    precision, reason = _auto_precision(held, provider, int8)
    assert precision == expected and reason


def test_provider_aliases_come_from_the_table() -> None:
    from edgecap.runtime.backends.onnxruntime.session import PROVIDER_ALIASES, PROVIDERS

    assert PROVIDER_ALIASES["trt"] == "TensorrtExecutionProvider" and PROVIDER_ALIASES["cpu"] == "CPUExecutionProvider"
    assert {p.name for p in PROVIDERS} == set(PROVIDER_ALIASES.values())


def test_int8_auto_choice_reads_the_recorded_deployment_not_the_preset_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registered preset's ``provider``/``runs_on_any_cpu`` decide, through the variant's ``deployment`` record;
    bundles exported before the record keep the built-in presets' behaviour."""
    import edgecap.runtime.backends.cpu
    from edgecap.runtime.backends.onnxruntime.providers import auto_precision as _auto_precision

    monkeypatch.setattr(edgecap.runtime.backends.cpu, "detect_cpu_preset", lambda: "cpu-vnni")
    cpu, trt = "CPUExecutionProvider", "TensorrtExecutionProvider"
    portable = {"preset": "toy", "deployment": {"provider": "cpu", "runs_on_any_cpu": True}}
    assert _auto_precision(["fp32", "int8"], cpu, portable)[0] == "int8"
    assert _auto_precision(["fp32", "int8"], cpu, {**portable, "deployment": {"provider": "cpu"}})[0] == "fp32"
    engine = {"preset": "toy-trt", "deployment": {"provider": "tensorrt", "runs_on_any_cpu": False}}
    assert _auto_precision(["fp32", "int8"], trt, engine)[0] == "int8"
    assert _auto_precision(["fp32", "int8"], cpu, engine)[0] == "fp32"
    assert _auto_precision(["fp32", "int8"], cpu, {"preset": "cpu-avx2"})[0] == "int8"  # no record: by name
    assert _auto_precision(["fp32", "int8"], trt, {"preset": "tensorrt"})[0] == "int8"


def test_int8_auto_choice_skips_a_scheme_the_installed_onnxruntime_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """8-bit weight-only steps (``MatMulNBits`` bits=8) have CPU kernels from onnxruntime 1.22 on: older runtimes
    take FP32, saying why."""
    import types

    import edgecap.runtime.backends.onnxruntime.providers as providers

    variant = {"preset": "cpu-avx2", "schemes": {"step": {"scheme": "weight-only", "bits": 8}}}
    monkeypatch.setattr(providers, "import_onnxruntime", lambda: types.SimpleNamespace(__version__="1.21.1"))
    precision, reason = providers.auto_precision(["fp32", "int8"], "CPUExecutionProvider", variant)
    assert precision == "fp32" and "onnxruntime >= 1.22" in reason and "1.21.1" in reason
    monkeypatch.setattr(providers, "import_onnxruntime", lambda: types.SimpleNamespace(__version__="1.22.0"))
    assert providers.auto_precision(["fp32", "int8"], "CPUExecutionProvider", variant)[0] == "int8"
    four_bit = {"preset": "cpu-avx2", "schemes": {"step": {"scheme": "weight-only", "bits": 4}}}
    monkeypatch.setattr(providers, "import_onnxruntime", lambda: types.SimpleNamespace(__version__="1.21.1"))
    assert providers.auto_precision(["fp32", "int8"], "CPUExecutionProvider", four_bit)[0] == "int8"


# -- the wide session (threads="auto" on free cores) -----------------------------------------------------------------
def _wide(step_rows: int = 6, encoder_rows: int = 2) -> WidePlan:
    return WidePlan(2, False, (("encoder", encoder_rows), ("step", step_rows)))


def test_the_wide_session_gives_the_narrow_sessions_outputs() -> None:
    """Same graph on 1 and 2 threads: every output within 1e-6, and the rows threshold decides which runs."""
    model = exported(TEST_CONFIGS[0]).model("step")
    narrow = OnnxRuntimeSession(model, providers=["cpu"], intra_op_threads=1)
    both = OnnxRuntimeSession(model, providers=["cpu"], intra_op_threads=1, wide=_wide(step_rows=6))
    with narrow, both:
        assert both.wide_session is None  # nothing needed it yet
        for rows in (1, 3, 5):
            small = _step_feed(TEST_CONFIGS[0], batch=rows)
            for name, value in both.infer(small).items():
                np.testing.assert_array_equal(value, narrow.infer(small)[name])
        assert both.wide_session is None and both.wide_inference_count == 0 and "wide" not in both.session_settings
        for rows in (6, 9):
            large = _step_feed(TEST_CONFIGS[0], batch=rows)
            expected, got = narrow.infer(large), both.infer(large)
            for name, value in expected.items():
                np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-6)
        assert both.wide_inference_count == 2 and both.inference_count == 5
        wide = both.session_settings["wide"]
        assert (wide["intra_op_threads"], wide["inter_op_threads"], wide["execution_mode"]) == (2, 1, "sequential")
        assert [wide[key] for key in SPIN_KEYS] == ["0", "0"]
        assert both.session_settings["intra_op_threads"] == 1  # the narrow session's own, unchanged
        assert both.wide_session.get_session_options().intra_op_num_threads == 2
    assert "wide" not in both.session_settings  # closed with the runtime


@pytest.mark.parametrize("io_binding", [False, True])
def test_decoding_on_the_wide_sessions_gives_the_same_tokens(io_binding: bool) -> None:
    config = TEST_CONFIGS[0]
    models = exported(config).runtime_models("fp32")
    cfg = decode_cfg(config, min_len=3, n_best=3)
    images = random_images(4, seed=5)
    with create_onnxruntime_step_model(**models, intra_op_threads=1) as narrow:
        expected = decode(narrow, images, cfg)
    options = {"intra_op_threads": 1, "wide": _wide(step_rows=12, encoder_rows=2), "io_binding": io_binding}
    with create_onnxruntime_step_model(**models, **options) as step_model:
        single = decode(step_model, {k: v[:1] for k, v in images.items()}, cfg)  # 1 image, 3 hypotheses
        assert step_model.encoder.wide_session is None and step_model.loop_runtime.wide_session is None
        got = decode(step_model, images, cfg)  # 4 images, 12 hypotheses: both graphs run wide
        assert step_model.encoder.wide_inference_count == 1 and step_model.loop_runtime.wide_inference_count > 0
    assert [h.tokens for h in single[0]] == [h.tokens for h in expected[0]]
    for want, have in zip(expected, got, strict=True):
        assert [h.tokens for h in have] == [h.tokens for h in want]
        for h_want, h_have in zip(want, have, strict=True):
            assert h_have.score == pytest.approx(h_want.score, abs=1e-5)


def test_the_wide_session_is_created_once_under_concurrent_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Streams call one runtime from several threads: the first large calls race to create the wide session."""
    opened = []
    original = OnnxRuntimeSession._open_wide

    def slow_open(self, rows):  # type: ignore[no-untyped-def]
        opened.append(rows)
        time.sleep(0.05)  # widen the window in which other threads see no wide session yet
        return original(self, rows)

    monkeypatch.setattr(OnnxRuntimeSession, "_open_wide", slow_open)
    feed = _step_feed(TEST_CONFIGS[0], batch=6)
    runtime = OnnxRuntimeSession(
        exported(TEST_CONFIGS[0]).model("step"), providers=["cpu"], intra_op_threads=1, wide=_wide()
    )
    barrier = threading.Barrier(4)

    def call() -> dict[str, np.ndarray]:
        barrier.wait()
        return runtime.infer(feed)

    with runtime, concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: call(), range(4)))
        assert opened == [6] and runtime.wide_session is not None and runtime.wide_inference_count == 4
    for result in results[1:]:
        np.testing.assert_array_equal(result["logprobs"], results[0]["logprobs"])


def test_the_role_picks_the_threshold() -> None:
    result = exported(TEST_CONFIGS[0])
    init, step = result.runtime_models("fp32")["encoder"], result.model("step")
    wide = WidePlan(2, False, (("encoder", 2),))  # no step threshold: the step never runs wide
    with OnnxRuntimeSession(step, providers=["cpu"], wide=wide) as runtime:
        runtime.infer(_step_feed(TEST_CONFIGS[0], batch=8))
        assert runtime.wide_session is None
    images = {k: v.numpy() for k, v in random_images(2).items()}
    with OnnxRuntimeSession(init, providers=["cpu"], wide=wide) as encoder:  # graph_role "init" counts as the encoder
        encoder.infer({name: images[name] for name in encoder.input_metadata()})
        assert encoder.wide_session is not None
    with OnnxRuntimeSession(init, providers=["cpu"], wide=wide, role="refine") as other:  # an explicit role wins
        other.infer({name: images[name] for name in other.input_metadata()})
        assert other.wide_session is None
    with pytest.raises(TypeError, match="WidePlan"):
        OnnxRuntimeSession(step, wide={"intra_op": 2})  # type: ignore[arg-type]


@pytest.mark.parametrize(("threads", "wide"), [("auto", True), ("dedicated", False), (1, False), (0, False)])
def test_only_auto_on_two_cores_gets_a_wide_session(threads: int | str, wide: bool) -> None:
    from edgecap.runtime.backends.onnxruntime.loader import _thread_options
    from edgecap.runtime.backends.registry import LoadRequest

    plan = plan_threads(threads, cores=2)
    assert (plan.wide is not None) is wide
    runtime = OnnxRuntimeSession(exported(TEST_CONFIGS[0]).model("step"), providers=["cpu"], **plan.runtime_options())
    with runtime:
        runtime.infer(_step_feed(TEST_CONFIGS[0], batch=max(WIDE_FROM_ROWS.values())))
        assert (runtime.wide_session is not None) is wide
    gpu_plan, options = _thread_options(LoadRequest(threads=threads), CUDA, {})
    assert gpu_plan is None and "wide" not in options  # CUDA/TensorRT: the CPU threads only feed the device
