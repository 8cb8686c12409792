"""A GPU build of ONNX Runtime whose CUDA/TensorRT providers cannot start: what runs is what the runtime says and does.

ONNX Runtime does not fail when a GPU provider cannot load (no driver, no TensorRT): it runs the session on the CPU.
The runtime must then follow the providers its session got (device, io-binding, array type, wide session), a
bundle's load must be planned again for the CPU (precision, threads, reasons), the cause must be reported, and
``edgecap caption`` must say it in one line while ``--json`` keeps a clean stdout. The CPU onnxruntime installed here
cannot show any of that, so :mod:`tests.runtime.backends.fake_onnxruntime_gpu` plays onnxruntime-gpu on this machine
(checked
against the real module's surface); ``tests/gpu_fallback`` runs the same on the real wheel.
"""

from __future__ import annotations

import gc
import json
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgecap import Captioner
from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeSession
from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model
from edgecap.runtime.backends.threads import WidePlan
from edgecap.runtime.decoding import decode
from tests.runtime.backends.fake_onnxruntime_gpu import (
    CPU,
    CUDA,
    CUDA_ERROR,
    REAL_OUTPUT,
    TRT,
    TRT_ERROR,
    FailingGpuOnnxRuntime,
    surface_mismatches,
)
from tests.runtime.backends.test_onnxruntime_session import _step_feed
from tests.runtime.bundle.helpers import copy_bundle, pixel_bundle, region_bundle
from tests.workshop.export.helpers import TEST_CONFIGS, decode_cfg, exported, random_images

pytestmark = pytest.mark.usefixtures("flush_denormals")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture
def gpu_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> FailingGpuOnnxRuntime:
    """onnxruntime-gpu with failing GPU providers, as ``import onnxruntime`` finds it for the test."""
    import onnxruntime

    fake = FailingGpuOnnxRuntime(sys.modules.get("onnxruntime", onnxruntime))
    monkeypatch.setitem(sys.modules, "onnxruntime", fake)
    fallback = sys.modules.get("edgecap.runtime.backends.onnxruntime.fallback")
    if fallback is not None:
        monkeypatch.setattr(fallback, "_preloaded", False)
    return fake


@pytest.fixture
def pixels(tiny_data, tmp_path_factory, tmp_path) -> Path:
    """A copy of the pixels-in bundle: a load planned for TensorRT makes its engine cache directory in the bundle."""
    return copy_bundle(pixel_bundle(tiny_data, tmp_path_factory)[0], tmp_path / "pixels")


@pytest.fixture(scope="module")
def images(tiny_data) -> list[Path]:
    return sorted((tiny_data[0] / "images").iterdir())[:4]


def _fallback_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if w.category.__name__ == "ProviderFallbackWarning"]


def _shapes(option: str) -> dict[str, str]:
    """``"a:1x2,b:3"`` (a TensorRT profile option) -> ``{"a": "1x2", "b": "3"}``."""
    return dict(item.split(":") for item in option.split(","))


def test_the_fake_has_the_real_modules_surface() -> None:
    import onnxruntime

    assert surface_mismatches(FailingGpuOnnxRuntime(onnxruntime), onnxruntime) == []


# -- one session -----------------------------------------------------------------------------------------------------
def test_a_runtime_follows_the_providers_its_session_got(gpu_onnxruntime: FailingGpuOnnxRuntime, capfd) -> None:
    """Asked for TensorRT/CUDA (io-binding on the device by default), running on the CPU: numpy on the CPU, the wide
    session back, and the outputs of a plain CPU session; the old runtime moved its inputs to a CUDA device."""
    model = exported(TEST_CONFIGS[0]).model("step")
    wide = WidePlan(2, False, (("step", 2),))
    runtime = OnnxRuntimeSession(model, wide=wide, role="step")
    assert runtime.providers == [TRT, CUDA, CPU]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runtime.activate()
    try:
        assert runtime.providers_in_use() == [CPU]
        assert (runtime.device_type, runtime.io_binding, runtime.array_type) == ("cpu", False, "numpy")
        assert runtime.wide is wide
        feed = _step_feed(TEST_CONFIGS[0])
        got = runtime.infer(feed)
        assert isinstance(got["logprobs"], np.ndarray)
    finally:
        runtime.close()
    with OnnxRuntimeSession(model, providers=["cpu"]) as plain:
        np.testing.assert_array_equal(got["logprobs"], plain.infer(feed)["logprobs"])
    assert "libnvinfer.so.10" in runtime.provider_fallback.cause and "libcuda.so.1" in runtime.provider_fallback.cause
    assert len(_fallback_warnings(caught)) == 1
    out, err = capfd.readouterr()
    assert "EP Error" not in out and "EP Error" not in err  # ONNX Runtime's notice went to the debug log


def test_decoding_on_a_pair_whose_gpu_providers_did_not_start(gpu_onnxruntime: FailingGpuOnnxRuntime) -> None:
    """Both sessions of a step model fall back: the state follows them into numpy and the tokens are the CPU's."""
    result = exported(TEST_CONFIGS[0])
    cfg, inputs = decode_cfg(TEST_CONFIGS[0]), random_images(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with create_onnxruntime_step_model(**result.runtime_models("fp32")) as step_model:
            got = decode(step_model, inputs, cfg)
            assert step_model.step_runtime.array_type == "numpy"
    with create_onnxruntime_step_model(**result.runtime_models("fp32"), providers=["cpu"]) as step_model:
        want = decode(step_model, inputs, cfg)
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]


def test_a_refine_pair_whose_gpu_providers_did_not_start_decodes_in_numpy(
    gpu_onnxruntime: FailingGpuOnnxRuntime,
) -> None:
    """LaBERT's encoder + refine pair made directly (not through ``Captioner.load``, which reopens on the CPU): the
    pair picks its array conversions once its sessions exist, so the fallen-back sessions get numpy, not torch."""
    from edgecap.runtime.backends.onnxruntime.refine import create_onnxruntime_refine_model
    from tests.runtime.backends.test_refine import _cfg, exported_fp32

    images, cfg = random_images(3, regions=7, seed=11), _cfg(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with create_onnxruntime_refine_model(**exported_fp32().runtime_models("fp32")) as refine_model:
            state = refine_model.encode(images)
            assert all(type(value) is np.ndarray for value in state.values()), {k: type(v) for k, v in state.items()}
            got = decode(refine_model, images, cfg)
    with create_onnxruntime_refine_model(**exported_fp32().runtime_models("fp32"), providers=["cpu"]) as refine_model:
        want = decode(refine_model, images, cfg)
    assert [h[0].tokens for h in got] == [h[0].tokens for h in want]


# -- a bundle's load -------------------------------------------------------------------------------------------------
def test_a_load_is_planned_again_for_the_provider_that_runs(
    gpu_onnxruntime, tiny_data, tmp_path_factory, tmp_path
) -> None:
    """An FP16 + INT8 bundle on a GPU build whose providers fail: not FP16 'for TensorRT' on the CPU, but what the CPU
    takes, with the CPU's thread plan and reasons about the CPU; the first sessions are let go."""
    from edgecap.runtime.bundle import load_bundle

    bundle = copy_bundle(region_bundle(tiny_data, tmp_path_factory), tmp_path / "bundle")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = Captioner.load(bundle, runtime="onnxruntime")
    with cap:
        info = cap.runtime_info
        assert info["providers"] == [CPU] and info["device"] == "cpu"
        assert info["precision"] != "fp16" and "TensorRT" not in info["precision_reason"]
        held = load_bundle(bundle, verify=False, graphs="none")
        from edgecap.runtime.backends.onnxruntime.providers import auto_precision

        assert info["precision"] == auto_precision(held.precisions, CPU, held.manifest["variants"].get("int8"))[0]
        assert info["provider_reason"].startswith(f"{CPU}: ONNX Runtime fell back from {TRT}")
        assert info["threads"]["intra_op"] >= 1  # the CPU's thread plan ran
        fallback = info["provider_fallback"]
        assert fallback["requested"] == [TRT, CUDA, CPU] and fallback["in_use"] == [CPU]
        assert "libnvinfer.so.10" in fallback["cause"] and "no NVIDIA driver" in fallback["cause"]
        assert CPU in info["summary"] and "TensorRT" not in info["summary"]
        reopened = [[e if isinstance(e, str) else e[0] for e in call] for call in gpu_onnxruntime.calls[-2:]]
        assert reopened == [[CPU], [CPU]]  # the sessions that run were asked for the CPU alone
    assert len(_fallback_warnings(caught)) == 1
    gc.collect()
    assert [ref() for ref in gpu_onnxruntime.sessions] == [None] * len(
        gpu_onnxruntime.sessions
    )  # the first sessions are gone


def test_captions_after_the_fallback_are_the_cpus(gpu_onnxruntime, pixels, images) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Captioner.load(pixels, runtime="onnxruntime", beam=3) as cap:
            got = cap.batch(images)
            assert cap.runtime_info["precision"] == "fp32"
    with Captioner.load(pixels, runtime="onnxruntime", precision="fp32", beam=3, providers=["cpu"]) as cap:
        assert got == cap.batch(images) and all(got)


def test_caption_says_once_why_it_runs_on_the_cpu(gpu_onnxruntime, pixels, images) -> None:
    from edgecap.cli import main

    result = CliRunner().invoke(main, ["caption", "--model", str(pixels), "--json", *map(str, images[:2])])
    assert result.exit_code == 0, result.output
    captions = json.loads(result.stdout)  # nothing of ONNX Runtime's on stdout
    assert list(captions) == [str(p) for p in images[:2]] and all(captions.values())
    said = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(said) == 1, result.stderr
    assert "running on CPU" in said[0] and "libnvinfer.so.10" in said[0] and "libcuda.so.1" in said[0]


# -- TensorRT options reach the provider -----------------------------------------------------------------------------
def test_the_load_request_tunes_and_bounds_the_tensorrt_provider(monkeypatch, pixels) -> None:
    """``trt_opt_batch`` and the beam set the profiles' opt rows (the step graph: images × beam), the manifest the
    max rows, and the workspace is bounded (1 GiB unless told)."""
    import onnxruntime

    fake = FailingGpuOnnxRuntime(
        onnxruntime, pretend_started=(TRT, CUDA)
    )  # the load goes as far as the sessions' options
    monkeypatch.setitem(sys.modules, "onnxruntime", fake)
    bundle = pixels
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32", beam=2, trt_opt_batch=4) as cap:
        assert cap.runtime_info["tensorrt"] == {"opt_batch": 4, "beam": 2, "workspace_mb": 1024}
        max_rows = json.loads((bundle / "manifest.json").read_text())["interface"]["dims"]["batch"]["max"]
    trt_options = [dict(call[0][1]) for call in fake.calls if call and call[0][0] == TRT]
    assert len(trt_options) == 2  # encoder and step
    encoder, step = trt_options
    assert all(o["trt_max_workspace_size"] == 1024 << 20 for o in trt_options)
    assert _shapes(encoder["trt_profile_opt_shapes"])["pixel_values"].startswith("4x")  # one row per image
    assert _shapes(step["trt_profile_opt_shapes"])["tokens"] == "8"  # 4 images × beam 2
    assert _shapes(step["trt_profile_max_shapes"])["tokens"] == str(max_rows)
    assert _shapes(encoder["trt_profile_max_shapes"])["pixel_values"].startswith(f"{max_rows}x")
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32", trt_workspace_mb=0) as cap:
        assert cap.runtime_info["tensorrt"]["workspace_mb"] is None
    assert "trt_max_workspace_size" not in dict(fake.calls[-1][0][1])


# -- the cause, and ONNX Runtime's output ----------------------------------------------------------------------------
def _real_output(trt_error: str = TRT_ERROR, cuda_error: str = CUDA_ERROR) -> str:
    stderr, stdout = REAL_OUTPUT
    fills = {"capi": "/venv/onnxruntime/capi", "trt_error": trt_error, "cuda_error": cuda_error}
    return _ANSI.sub("", stderr.format(**fills) + stdout.format(**fills, providers=[TRT, CUDA, CPU]))


def test_the_cause_names_what_each_providers_library_lacks() -> None:
    from edgecap.runtime.backends.onnxruntime.fallback import fallback_cause

    assert fallback_cause(_real_output(), [TRT, CUDA]) == (
        "TensorRT: TensorRT is not installed: libnvinfer.so.10: cannot open shared object file: No such file or "
        "directory; CUDA: no NVIDIA driver: libcuda.so.1: cannot open shared object file: No such file or directory"
    )
    cublas = "libcublasLt.so.13: cannot open shared object file: No such file or directory"  # no CUDA libraries
    assert fallback_cause(_real_output(cuda_error=cublas), [CUDA]) == (
        f"CUDA: the CUDA libraries are not installed: {cublas}"
    )


def test_without_a_load_error_the_cause_is_what_onnxruntime_said_instead() -> None:
    from edgecap.runtime.backends.onnxruntime.fallback import fallback_cause

    lines = [line for line in _real_output().splitlines() if "Failed to load library" not in line]
    text = "\n".join(lines)
    cause = fallback_cause(text, [TRT, CUDA])
    assert cause.startswith("TensorRT: Please install TensorRT libraries as mentioned in the GPU requirements page")
    assert "; CUDA: Require cuDNN 9.* and CUDA 13.*" in cause
    record = "2026-01-01 00:00:00.0 [E:onnxruntime:Default, cuda_call.cc:123 CudaCall] CUDA failure 100: no CUDA-"
    assert fallback_cause(record + "capable device is detected ; GPU=0", [CUDA]) == (
        "CUDA: CUDA failure 100: no CUDA-capable device is detected ; GPU=0"
    )
    assert fallback_cause("", [CUDA]) == "CUDA: ONNX Runtime gave no reason"


def test_when_onnxruntime_says_nothing_the_library_is_loaded_to_ask_the_loader(tmp_path: Path) -> None:
    import types

    from edgecap.runtime.backends.onnxruntime.fallback import fallback_cause, provider_library_error

    (tmp_path / "capi").mkdir()
    (tmp_path / "capi" / "libonnxruntime_providers_cuda.so").write_bytes(b"not a shared library")
    module = types.SimpleNamespace(__file__=str(tmp_path / "__init__.py"))
    error = provider_library_error(module, CUDA)
    assert error is not None and error.startswith("libonnxruntime_providers_cuda.so: ")
    assert fallback_cause("", [CUDA], module) == f"CUDA: {error}"
    assert provider_library_error(module, TRT) is None  # no library of its own here: nothing to ask
    assert provider_library_error(module, CPU) is None


class _StubOnnxRuntime:
    """Just what :func:`open_session` calls: sessions on the providers asked for, after writing to both streams."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.preloads = fail, 0

    def preload_dlls(self) -> None:
        self.preloads += 1
        print("Failed to load libcublasLt.so.13")  # what the real one prints for each library it cannot find

    def InferenceSession(self, source, options, providers):  # noqa: N802, ANN001, ANN201
        import os
        import types

        os.write(2, b"2026 [W:onnxruntime:Default, x.cc:1 f] a TensorRT warning\n")
        print("a notice")
        if self.fail:
            raise RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH : bad graph")
        names = [p[0] for p in providers]
        return types.SimpleNamespace(get_providers=lambda: names)


def test_output_goes_back_where_it_was_going_when_nothing_fell_back(monkeypatch, capfd) -> None:
    import edgecap.runtime.backends.onnxruntime.fallback as fallback

    monkeypatch.setattr(fallback, "_preloaded", False)
    onnxruntime = _StubOnnxRuntime()
    session, dropped = fallback.open_session(onnxruntime, b"", None, [(CUDA, {}), (CPU, {})])
    assert session.get_providers() == [CUDA, CPU] and dropped is None
    out, err = capfd.readouterr()
    assert out == "a notice\n" and "a TensorRT warning" in err
    assert onnxruntime.preloads == 1 and "libcublasLt" not in out  # preloading's own prints go to the debug log
    fallback.open_session(onnxruntime, b"", None, [(CUDA, {}), (CPU, {})])
    assert onnxruntime.preloads == 1  # once per process
    capfd.readouterr()
    with pytest.raises(RuntimeError, match="INVALID_GRAPH"):
        fallback.open_session(_StubOnnxRuntime(fail=True), b"", None, [(CUDA, {}), (CPU, {})])
    out, err = capfd.readouterr()
    assert out == "a notice\n" and "a TensorRT warning" in err  # what ONNX Runtime said about the failure stays


def test_cpu_sessions_are_neither_captured_nor_preloaded(monkeypatch, capfd) -> None:
    import edgecap.runtime.backends.onnxruntime.fallback as fallback

    monkeypatch.setattr(fallback, "_preloaded", False)
    onnxruntime = _StubOnnxRuntime()
    monkeypatch.setattr(fallback, "capture_output", None)  # any capture would fail loudly
    fallback.open_session(onnxruntime, b"", None, [(CPU, {})])
    assert onnxruntime.preloads == 0 and capfd.readouterr().out == "a notice\n"
    monkeypatch.setenv("EDGECAP_ONNXRUNTIME_PRELOAD_DLLS", "0")
    fallback.preload_gpu_libraries(onnxruntime)
    assert onnxruntime.preloads == 0
