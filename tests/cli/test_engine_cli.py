"""``edgecap engine``: builds into the bundle (through a stand-in TensorRT here), keeps an up-to-date set, and
refuses in one line without TensorRT, without a GPU, or for graphs the bundle does not have."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import edgecap.runtime.engines.build as build
import edgecap.runtime.engines.cuda as cuda
from edgecap.cli import main
from edgecap.runtime.engines.store import EngineEnv
from tests.runtime.bundle.helpers import copy_bundle, pixel_bundle
from tests.runtime.engines import simulated_device as sim
from tests.runtime.engines.fake_trt import fake_tensorrt


@pytest.fixture
def bundle(tiny_data, tmp_path_factory, tmp_path) -> Path:
    return copy_bundle(pixel_bundle(tiny_data, tmp_path_factory)[0], tmp_path / "bundle")


def test_builds_then_keeps(bundle: Path, monkeypatch) -> None:
    monkeypatch.setattr(build, "load_tensorrt", lambda: fake_tensorrt("11.0.0.114"))
    monkeypatch.setattr(build, "current_env", lambda trt, device=0: EngineEnv("11.0.0.114", "NVIDIA H100", "9.0"))
    monkeypatch.setattr(cuda, "set_device", sim.set_device)
    args = ["engine", str(bundle), "--precision", "fp32", "--max-batch", "4", "--beam", "2", "--workspace", "256"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "strongly typed (the only mode)" in first.output and "building step" in first.output
    assert "built: " in first.output and "fp32-b4-k2-" in first.output
    second = CliRunner().invoke(main, args)
    assert second.exit_code == 0 and "kept (up to date)" in second.output
    assert "built: " in CliRunner().invoke(main, [*args, "--rebuild"]).output
    monkeypatch.setattr(build, "current_env", lambda trt, device=0: EngineEnv("11.0.0.114", "NVIDIA H200", "9.0"))
    other_gpu = CliRunner().invoke(main, args)
    assert other_gpu.exit_code == 0 and "built: " in other_gpu.output
    assert "stale here: fp32-b4-k2-" in other_gpu.output and "built on NVIDIA H100" in other_gpu.output


def test_refusals(bundle: Path, monkeypatch) -> None:
    monkeypatch.setattr(build, "load_tensorrt", lambda: fake_tensorrt())
    result = CliRunner().invoke(main, ["engine", str(bundle), "--precision", "fp16"])
    assert result.exit_code == 1 and "has no fp16 graphs" in result.output and "Traceback" not in result.output

    def no_gpu(device: int = 0):
        raise cuda.CudaUnavailableError("no CUDA GPU is visible (cudaGetDeviceCount returned 0)")

    monkeypatch.setattr(cuda, "gpu_info", no_gpu)
    result = CliRunner().invoke(main, ["engine", str(bundle), "--precision", "fp32"])
    assert result.exit_code == 1 and "TensorRT engines need a CUDA GPU: no CUDA GPU is visible" in result.output
    result = CliRunner().invoke(main, ["engine", str(bundle.parent / "missing")])
    assert result.exit_code == 1 and "not a directory" in result.output
    assert not (bundle / "engines").exists()


def test_device_option_builds_on_that_gpu(bundle: Path, monkeypatch) -> None:
    trt = fake_tensorrt()
    seen = []

    class Builder(trt.Builder):
        def __init__(self, logger) -> None:
            seen.append(sim.current_device())
            super().__init__(logger)

    trt.Builder = Builder
    monkeypatch.setattr(build, "load_tensorrt", lambda: trt)
    monkeypatch.setattr(build, "current_env", lambda trt, device=0: EngineEnv("10.3.0.30", f"GPU{device}", "9.0"))
    monkeypatch.setattr(cuda, "set_device", sim.set_device)
    sim.set_device(0)
    result = CliRunner().invoke(
        main, ["engine", str(bundle), "--precision", "fp32", "--max-batch", "2", "--device", "1"]
    )
    assert result.exit_code == 0, result.output
    assert seen and set(seen) == {1}  # every engine of the set was built on GPU 1, whose name its record carries
