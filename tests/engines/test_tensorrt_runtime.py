"""The ``tensorrt`` runtime: clear refusals without TensorRT, cuda-python, a GPU or a fitting engine (on every
machine), and its decoding logic on a simulated device (``simulated_device``), whose captions must equal ONNX
Runtime's on the same FP32 graphs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import edgecap.engines.build as build
import edgecap.engines.cuda as cuda
import edgecap.runtimes.registry as registry
import edgecap.runtimes.tensorrt as trt_runtime
from edgecap import Captioner
from edgecap.cli import main
from edgecap.engines.store import EngineEnv
from edgecap.runtimes.registry import CaptionerError, LoadRequest
from tests.bundle.helpers import copy_bundle, labert_bundle, pixel_bundle
from tests.engines import simulated_device as sim
from tests.engines.fake_trt import fake_tensorrt

ORIN = EngineEnv("10.3.0.30", "Orin", "8.7")


@pytest.fixture
def bundle(tiny_data, tmp_path_factory, tmp_path) -> Path:
    return copy_bundle(pixel_bundle(tiny_data, tmp_path_factory)[0], tmp_path / "bundle")


@pytest.fixture
def images(tiny_data) -> list[Path]:
    return sorted((tiny_data[0] / "images").iterdir())[:4]


def _tensorrt_unavailable() -> bool:
    return not registry.get_runtime("tensorrt").available()[0]


# -- refusals ----------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not _tensorrt_unavailable(), reason="TensorRT and cuda-python are installed here")
def test_captioner_refuses_without_tensorrt(bundle: Path) -> None:
    with pytest.raises(CaptionerError, match=r"runtime 'tensorrt' needs .*tensorrt.*edgecap engine"):
        Captioner.load(bundle, runtime="tensorrt")


@pytest.mark.skipif(not _tensorrt_unavailable(), reason="TensorRT and cuda-python are installed here")
def test_cli_caption_and_engine_refuse_without_tensorrt(bundle: Path, images) -> None:
    result = CliRunner().invoke(main, ["caption", str(images[0]), "--model", str(bundle), "--runtime", "tensorrt"])
    assert result.exit_code != 0 and "needs tensorrt" in result.output
    result = CliRunner().invoke(main, ["engine", str(bundle), "--precision", "fp32"])
    assert result.exit_code == 1 and "TensorRT is not available" in result.output, result.output
    assert not (bundle / "engines").exists()


@pytest.mark.skipif(not _tensorrt_unavailable(), reason="TensorRT and cuda-python are installed here")
def test_cli_bench_reports_tensorrt_unavailable(bundle: Path, tmp_path: Path) -> None:
    args = ["bench", "--bundle", str(bundle), "--runtime", "tensorrt", "--precision", "fp32", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and "tensorrt fp32: " in result.output and "needs tensorrt" in result.output, (
        result.output
    )


def test_loader_refusals(bundle: Path, monkeypatch) -> None:
    monkeypatch.setattr(build, "load_tensorrt", lambda: fake_tensorrt())

    def no_gpu(device: int = 0):
        raise cuda.CudaUnavailableError("no CUDA GPU is visible")

    monkeypatch.setattr(cuda, "gpu_info", no_gpu)
    from edgecap.bundle import load_bundle

    opened = load_bundle(bundle)
    with pytest.raises(CaptionerError, match="need a CUDA GPU"):
        trt_runtime.load_bundle_runtime(opened, LoadRequest())
    monkeypatch.setattr(build, "current_env", lambda trt, device=0: ORIN)
    with pytest.raises(CaptionerError, match=r"no fp32 TensorRT engine for TensorRT 10\.3.*edgecap engine"):
        trt_runtime.load_bundle_runtime(opened, LoadRequest())
    with pytest.raises(CaptionerError, match="CUDA devices"):
        trt_runtime.load_bundle_runtime(opened, LoadRequest(device="cpu"))
    with pytest.raises(Exception, match="no 'fp16' variant"):
        trt_runtime.load_bundle_runtime(opened, LoadRequest(precision="fp16"))


def test_a_modified_plan_is_never_loaded(bundle: Path, monkeypatch) -> None:
    monkeypatch.setattr(build, "load_tensorrt", lambda: fake_tensorrt())
    monkeypatch.setattr(cuda, "set_device", sim.set_device)
    monkeypatch.setattr(build, "current_env", lambda trt, device=0: ORIN)
    folder = build.build_engines(bundle, precision="fp32", max_batch=2, beam=2).folder
    (folder / "encoder.plan").write_bytes(b"x")
    from edgecap.bundle import load_bundle

    with pytest.raises(CaptionerError, match="SHA-256 differs"):
        trt_runtime.load_bundle_runtime(load_bundle(bundle), LoadRequest(beam=2))


# -- decoding on a simulated device ------------------------------------------------------------------------------------
@pytest.fixture
def simulated(monkeypatch):
    """TensorRT 10.3 on an Orin as far as edgecap can tell: stand-in build API, simulated memory and engines."""
    monkeypatch.setattr(build, "load_tensorrt", lambda: fake_tensorrt())
    monkeypatch.setattr(build, "current_env", lambda trt, device=0: ORIN)
    monkeypatch.setattr(cuda, "DeviceBuffer", sim.FakeBuffer)
    monkeypatch.setattr(cuda, "Stream", sim.FakeStream)
    monkeypatch.setattr(cuda, "set_device", sim.set_device)
    monkeypatch.setattr(trt_runtime, "_launch", sim.fake_launch)
    monkeypatch.setitem(
        registry._REGISTRY, "tensorrt", dataclasses.replace(registry.get_runtime("tensorrt"), requires=())
    )

    def enter(self):
        self.engines.update(sim.engines_from_record(self.folder, self.record, self.folder.parents[1], self.roles))
        return self

    monkeypatch.setattr(trt_runtime._EngineSet, "__enter__", enter)


@pytest.mark.parametrize("beam", [1, 3])
def test_captions_equal_onnx_runtime(bundle: Path, images, simulated, beam: int) -> None:
    build.build_engines(bundle, precision="fp32", max_batch=4, beam=3)
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32", beam=beam) as ort_cap:
        expected = ort_cap.batch(images)
    with Captioner.load(bundle, runtime="tensorrt", beam=beam) as cap:
        info = cap.runtime_info
        assert info["precision"] == "fp32" and info["tensorrt"] == "10.3.0.30" and info["gpu"] == "Orin"
        assert cap.batch(images) == expected
        assert cap.batch(images, batch_size=3) == expected  # a second batch shape: its own buffers
        assert cap(images[1]) == expected[1]
    assert not sim.MEMORY  # closing the captioner freed every buffer


def test_more_images_than_the_engines_serve_are_refused(bundle: Path, images, simulated) -> None:
    build.build_engines(bundle, precision="fp32", max_batch=2, beam=3)
    with (
        Captioner.load(bundle, runtime="tensorrt", beam=3) as cap,
        pytest.raises(trt_runtime.TrtEngineError, match="exceed the engines' max batch 2"),
    ):
        cap.batch(images, batch_size=4)
    with pytest.raises(CaptionerError, match=r"built for beam 3, decoding asks for beam 4.*--beam 4`"):
        Captioner.load(bundle, runtime="tensorrt", beam=4)  # refused at load, not at every caption


def test_labert_mask_predict_equals_onnx_runtime(tiny_data, tmp_path_factory, tmp_path, images, simulated) -> None:
    bundle = copy_bundle(labert_bundle(tiny_data, tmp_path_factory)[0], tmp_path / "labert")
    build.build_engines(bundle, precision="fp32", max_batch=4)
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32") as ort_cap:
        expected = ort_cap.batch(images)
    with Captioner.load(bundle, runtime="tensorrt") as cap:
        assert cap.batch(images) == expected


def test_engines_that_disagree_on_a_state_dtype_are_refused(bundle: Path, simulated, monkeypatch) -> None:
    build.build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    entered = trt_runtime._EngineSet.__enter__

    def half_cache(self):
        entered(self)
        step = self.engines["step"]
        step.dtypes[next(n for n in step.inputs if n.startswith("self_k"))] = np.dtype("float16")
        return self

    monkeypatch.setattr(trt_runtime._EngineSet, "__enter__", half_cache)
    with pytest.raises(
        trt_runtime.TrtEngineError, match=r"state 'self_k0' has different dtypes .*step:self_k0 float16"
    ):
        Captioner.load(bundle, runtime="tensorrt", beam=2)


def test_loading_picks_engines_that_serve_the_beam(bundle: Path, images, simulated) -> None:
    wide = build.build_engines(bundle, precision="fp32", max_batch=4, beam=1).folder
    beam3 = build.build_engines(bundle, precision="fp32", max_batch=2, beam=3).folder
    with Captioner.load(bundle, runtime="tensorrt", beam=3) as cap:
        assert cap.runtime_info["engines"] == str(beam3)
        assert len(cap.batch(images[:2])) == 2
    with Captioner.load(bundle, runtime="tensorrt", beam=1) as cap:
        assert cap.runtime_info["engines"] == str(wide)
    with pytest.raises(CaptionerError, match=r"built for beam 3, decoding asks for beam 4.*edgecap engine .*--beam 4"):
        Captioner.load(bundle, runtime="tensorrt", beam=4)
    (beam3 / "step.plan").write_bytes(b"truncated")
    other = build.build_engines(bundle, precision="fp32", max_batch=1, beam=5).folder
    with Captioner.load(bundle, runtime="tensorrt", beam=3) as cap:  # the best set fails verification: the next
        assert cap.runtime_info["engines"] == str(other)


def test_every_thread_runs_on_the_requested_device(bundle: Path, images, simulated) -> None:
    import threading

    build.build_engines(bundle, precision="fp32", max_batch=4, beam=3)
    sim.set_device(0)
    with Captioner.load(bundle, runtime="tensorrt", device="cuda:1") as cap:
        assert cap.runtime_info["device"] == "cuda:1"
        expected = cap.batch(images[:2])
        assert set(sim.DEVICE_OF.values()) == {1} and set(sim.STREAMS.values()) == {1}
        results = []
        other = threading.Thread(target=lambda: results.append(cap.batch(images[:2])))
        other.start()
        other.join()
        assert results == [expected]
        assert set(sim.DEVICE_OF.values()) == {1}  # the other thread set the device before it allocated
    assert not sim.MEMORY and not sim.STREAMS


def test_finished_threads_and_old_batch_shapes_release_device_memory(
    bundle: Path, images, simulated, monkeypatch
) -> None:
    import gc
    import threading

    monkeypatch.setattr(trt_runtime, "MAX_POOLS", 2)
    build.build_engines(bundle, precision="fp32", max_batch=4, beam=3)
    with Captioner.load(bundle, runtime="tensorrt", beam=3) as cap:
        (model,) = cap._resources
        cap.batch(images[:1])
        baseline = set(sim.MEMORY)
        for _ in range(3):  # a server that starts a thread per request
            request = threading.Thread(target=lambda: cap.batch(images[:2]))
            request.start()
            request.join()
        gc.collect()
        assert set(sim.MEMORY) == baseline and len(sim.STREAMS) == 1 and model.engines.workers() == 1
        for size in (1, 2, 3, 4, 3):  # more batch shapes than a worker keeps: the least recently used are freed
            cap.batch(images[:size], batch_size=size)
        pools = model.engines.worker().pools
        assert list(pools) == [4, 3]
        held = {b.ptr for pool in pools.values() for copies in pool._buffers.values() for b in copies}
        assert set(sim.MEMORY) == held
    assert not sim.MEMORY and not sim.STREAMS
