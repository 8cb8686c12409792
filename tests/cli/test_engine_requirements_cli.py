"""``edgecap engine`` on a machine that lacks a piece: one line naming what to install, exit status 1, no traceback.

The pieces, in the order the command needs them: onnx to read the graphs (the ``tensorrt-cuNN`` extras bring it; the
CPU onnxruntime is never suggested, it would shadow onnxruntime-gpu on a GPU machine), TensorRT, cuda-python, and a
driver cuda-python can use (cuda-python 12.x raises when libcuda.so.1 is missing; 13.x returns
``cudaErrorInsufficientDriver``, as it does on a driver older than CUDA 13).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner, Result

import edgecap.runtime.engines.cuda as cuda
from edgecap.cli import main
from tests.runtime.bundle.helpers import copy_bundle, pixel_bundle
from tests.runtime.engines.fake_trt import fake_tensorrt

_CUDA_MODULES = ("cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart")


@pytest.fixture(scope="module")
def bundle(tiny_data, tmp_path_factory) -> Path:
    return copy_bundle(pixel_bundle(tiny_data, tmp_path_factory)[0], tmp_path_factory.mktemp("engine-needs") / "b")


def _engine(bundle: Path) -> Result:
    result = CliRunner().invoke(main, ["engine", str(bundle), "--precision", "fp32", "--max-batch", "2"])
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception  # a ClickException, not an escaped error
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert "edgecap[cpu]" not in result.output, result.output
    assert not (bundle / "engines").exists()
    return result


def _with_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``tensorrt`` import succeeds (a stand-in module), so the command gets as far as the GPU."""
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())


def test_without_onnx(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("onnx", "onnxruntime"):
        monkeypatch.setitem(sys.modules, module, None)
    out = _engine(bundle).output
    assert "needs onnx" in out and "pip install onnx" in out, out
    assert "'edgecap[tensorrt-cu12]'" in out and "'edgecap[tensorrt-cu13]'" in out, out


def test_without_tensorrt(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    assert "TensorRT is not available" in _engine(bundle).output


def test_without_cuda_python(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _with_tensorrt(monkeypatch)
    for module in _CUDA_MODULES:
        monkeypatch.setitem(sys.modules, module, None)
    out = _engine(bundle).output
    assert "needs cuda-python" in out and "'edgecap[tensorrt-cu12]' or 'edgecap[tensorrt-cu13]'" in out, out


def test_cuda_python_12_without_a_driver(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_libcuda():
        raise RuntimeError("Failed to dlopen libcuda.so.1")

    _with_tensorrt(monkeypatch)
    monkeypatch.setattr(cuda, "cudart", lambda: SimpleNamespace(cudaGetDeviceCount=no_libcuda))
    out = _engine(bundle).output
    assert "no usable CUDA GPU: cuda-python cannot load the NVIDIA driver (Failed to dlopen libcuda.so.1)" in out, out


def test_cuda_python_13_on_an_older_driver(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Err(int):
        name = "cudaErrorInsufficientDriver"

    _with_tensorrt(monkeypatch)
    monkeypatch.setattr(cuda, "cudart", lambda: SimpleNamespace(cudaGetDeviceCount=lambda: (Err(35), 0)))
    monkeypatch.setattr(cuda, "_cuda_python_version", lambda: "13.4.4")
    out = _engine(bundle).output
    assert "cudaErrorInsufficientDriver (35): no NVIDIA driver here, or one older than CUDA 13" in out, out
    assert "'edgecap[tensorrt-cu12]'" in out, out
