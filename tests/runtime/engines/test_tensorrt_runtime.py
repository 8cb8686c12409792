"""The ``tensorrt`` runtime: clear refusals without TensorRT, cuda-python, a GPU or a fitting engine (on every
machine), and its decoding logic end to end through the fake ``tensorrt`` of a recorded real version: engines
deserialised by its ``Runtime``, contexts that bind device addresses and run on the simulated device
(``simulated_device``, ``fake_trt_runtime``). The captions must equal ONNX Runtime's on the same FP32 graphs, and
each value TensorRT reports (a NULL runtime, no context, a refused address, a type without numpy) must become a clear
error."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

import edgecap.runtime.backends.registry as registry
import edgecap.runtime.backends.tensorrt.engines as trt_engines
import edgecap.runtime.backends.tensorrt.runtime as trt_runtime
import edgecap.runtime.engines.build as build
import edgecap.runtime.engines.cuda as cuda
from edgecap import Captioner
from edgecap.cli import main
from edgecap.runtime.backends.registry import CaptionerError, LoadRequest
from tests.runtime.bundle.helpers import copy_bundle, labert_bundle, pixel_bundle
from tests.runtime.engines import simulated_device as sim
from tests.runtime.engines.fake_trt import Faults


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


def test_loader_refusals(bundle: Path, tensorrt_here, monkeypatch) -> None:
    def no_gpu(device: int = 0):
        raise cuda.CudaUnavailableError("no CUDA GPU is visible")

    monkeypatch.setattr(cuda, "gpu_info", no_gpu)
    from edgecap.runtime.bundle import load_bundle

    opened = load_bundle(bundle)
    with pytest.raises(CaptionerError, match="need a CUDA GPU"):
        trt_runtime.load_bundle_runtime(opened, LoadRequest())
    monkeypatch.setattr(cuda, "gpu_info", lambda device=0: cuda.GpuInfo(device, "Orin", "8.7"))
    with pytest.raises(CaptionerError, match=r"no fp32 TensorRT engine for TensorRT 10\.3.*edgecap engine"):
        trt_runtime.load_bundle_runtime(opened, LoadRequest())
    with pytest.raises(CaptionerError, match="CUDA devices"):
        trt_runtime.load_bundle_runtime(opened, LoadRequest(device="cpu"))
    with pytest.raises(Exception, match="no 'fp16' variant"):
        trt_runtime.load_bundle_runtime(opened, LoadRequest(precision="fp16"))


def test_a_modified_plan_is_never_loaded(bundle: Path, tensorrt_here) -> None:
    folder = build.build_engines(bundle, precision="fp32", max_batch=2, beam=2).folder
    (folder / "encoder.plan").write_bytes(b"x")
    from edgecap.runtime.bundle import load_bundle

    with pytest.raises(CaptionerError, match="SHA-256 differs"):
        trt_runtime.load_bundle_runtime(load_bundle(bundle), LoadRequest(beam=2))


# -- decoding on a simulated device ------------------------------------------------------------------------------------
@pytest.fixture
def simulated(tensorrt_here, monkeypatch):
    """TensorRT 10.3 on an Orin as far as edgecap can tell: the fake module (build and runtime), simulated memory and
    streams; nothing of edgecap's runtime is replaced."""
    monkeypatch.setattr(cuda, "DeviceBuffer", sim.FakeBuffer)
    monkeypatch.setattr(cuda, "Stream", sim.FakeStream)
    monkeypatch.setitem(
        registry._REGISTRY, "tensorrt", dataclasses.replace(registry.get_runtime("tensorrt"), requires=())
    )
    return tensorrt_here


@pytest.mark.parametrize(("version", "beam"), [("10.3", 1), ("10.3", 3), ("11.4", 3)])
def test_captions_equal_onnx_runtime(bundle: Path, images, simulated, version: str, beam: int) -> None:
    trt = simulated.use(version)
    build.build_engines(bundle, precision="fp32", max_batch=4, beam=3)
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32", beam=beam) as onnxruntime_cap:
        expected = onnxruntime_cap.batch(images)
    with Captioner.load(bundle, runtime="tensorrt", beam=beam) as cap:
        info = cap.runtime_info
        assert info["precision"] == "fp32" and info["tensorrt"] == trt.__version__ and info["gpu"] == "Orin"
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
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32") as onnxruntime_cap:
        expected = onnxruntime_cap.batch(images)
    with Captioner.load(bundle, runtime="tensorrt") as cap:
        assert cap.batch(images) == expected


def test_engines_that_disagree_on_a_state_dtype_are_refused(bundle: Path, simulated) -> None:
    build.build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    simulated.use("10.3", faults=Faults(retype={"step.onnx": {"self_k0": "HALF"}}))
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

    monkeypatch.setattr(trt_engines, "MAX_POOLS", 2)
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


# -- what TensorRT reports by value ------------------------------------------------------------------------------------
def test_tensorrt_that_cannot_start_cuda_is_refused_at_load(bundle: Path, images, simulated) -> None:
    build.build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    simulated.use("10.3", faults=Faults(cuda=False))  # trt.Runtime raises "factory function returned nullptr"
    with pytest.raises(CaptionerError, match=r"runtime 'tensorrt': TensorRT 10\.3\.0 could not start: CUDA could"):
        Captioner.load(bundle, runtime="tensorrt", beam=2)
    args = ["caption", str(images[0]), "--model", str(bundle), "--runtime", "tensorrt", "--beam", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "could not start: CUDA could not be initialised" in result.output, result.output
    assert isinstance(result.exception, SystemExit)  # a message, not a traceback


def test_engine_io_without_a_numpy_type_is_refused_by_name(bundle: Path, simulated) -> None:
    build.build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    simulated.use("10.3", faults=Faults(retype={"step.onnx": {"self_k0": "BF16"}}))  # trt.nptype raises on it
    with pytest.raises(trt_runtime.TrtEngineError, match=r"the step engine's input 'self_k0' is BF16, which no numpy"):
        Captioner.load(bundle, runtime="tensorrt", beam=2)
    assert not sim.MEMORY


def test_a_context_tensorrt_cannot_create_is_an_error(bundle: Path, images, simulated) -> None:
    build.build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    simulated.use("10.3", faults=Faults(no_context=True))  # create_execution_context returns None
    with (
        Captioner.load(bundle, runtime="tensorrt", beam=2) as cap,
        pytest.raises(trt_runtime.TrtEngineError, match="could not create an execution context for the encoder"),
    ):
        cap.batch(images[:2])


def test_an_address_tensorrt_refuses_is_named(bundle: Path, images, simulated) -> None:
    build.build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    simulated.use("10.3", faults=Faults(refused_addresses=frozenset({"logprobs"})))  # set_tensor_address -> False
    with (
        Captioner.load(bundle, runtime="tensorrt", beam=2) as cap,
        pytest.raises(trt_runtime.TrtEngineError, match=r"step engine: TensorRT refused the device address 0x[0-9a-f]+ "
                      r"of tensor 'logprobs'"),
    ):  # fmt: skip
        cap.batch(images[:2])
    assert not sim.MEMORY
