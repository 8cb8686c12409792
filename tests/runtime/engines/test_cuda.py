"""cuda-python plumbing without a GPU: results and errors of runtime calls, and the refusals when no GPU is visible."""

from __future__ import annotations

from enum import IntEnum
from types import SimpleNamespace

import pytest

import edgecap.runtime.engines.cuda as cuda
from edgecap.runtime.engines.cuda import CudaError, CudaUnavailableError, GpuInfo, call, gpu_info


class Err(IntEnum):
    cudaSuccess = 0
    cudaErrorNoDevice = 100
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35


def fake_cudart(count: int | None, name: bytes = b"NVIDIA H100 80GB HBM3", cc: tuple[int, int] = (9, 0)):
    props = SimpleNamespace(name=name + b"\x00\x00", major=cc[0], minor=cc[1])
    return SimpleNamespace(
        cudaGetDeviceCount=lambda: (Err.cudaErrorNoDevice, 0) if count is None else (Err.cudaSuccess, count),
        cudaGetDeviceProperties=lambda device: (Err.cudaSuccess, props),
        cudaMalloc=lambda n: (Err.cudaErrorMemoryAllocation, 0),
    )


def test_call_unpacks_results_and_names_errors() -> None:
    assert call((Err.cudaSuccess, 7)) == 7
    assert call((Err.cudaSuccess,)) is None
    assert call((Err.cudaSuccess, 1, 2)) == (1, 2)
    with pytest.raises(CudaError, match=r"cudaMalloc\(8\) failed: cudaErrorMemoryAllocation \(2\)"):
        call((Err.cudaErrorMemoryAllocation, 0), "cudaMalloc(8)")


def test_gpu_info(monkeypatch) -> None:
    monkeypatch.setattr(cuda, "cudart", lambda: fake_cudart(1))
    info = gpu_info()
    assert info == GpuInfo(0, "NVIDIA H100 80GB HBM3", "9.0") and info.slug() == "nvidia-h100-80gb-hbm3"
    with pytest.raises(CudaUnavailableError, match="device 3 does not exist"):
        gpu_info(3)


@pytest.mark.parametrize(("count", "message"), [(None, "cudaErrorNoDevice"), (0, "no CUDA GPU is visible")])
def test_no_gpu_is_refused(monkeypatch, count, message) -> None:
    monkeypatch.setattr(cuda, "cudart", lambda: fake_cudart(count))
    with pytest.raises(CudaUnavailableError, match=message):
        gpu_info()


def test_without_cuda_python(monkeypatch) -> None:
    for module in ("cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"):
        monkeypatch.setitem(__import__("sys").modules, module, None)
    with pytest.raises(CudaUnavailableError, match="needs cuda-python") as refused:
        cuda.cudart()
    assert "edgecap[tensorrt-cu12]" in str(refused.value) and "edgecap[tensorrt-cu13]" in str(refused.value)


def test_a_cuda_python_that_does_not_load_is_unavailable(monkeypatch) -> None:
    """Installed, but a library it loads on import is missing: a refusal, not the loader's OSError."""
    import builtins

    real_import = builtins.__import__

    def broken(name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if name.split(".")[0] == "cuda":
            raise OSError("libcudart.so.12: cannot open shared object file")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(CudaUnavailableError, match=r"cuda-python is installed but does not load \(libcudart"):
        cuda.cudart()


def test_a_cuda_python_12_without_a_driver_is_unavailable(monkeypatch) -> None:
    """cuda-python 12.2-12.6 raise RuntimeError from the first call when libcuda.so.1 is missing (no error result)."""

    def no_libcuda():
        raise RuntimeError("Failed to dlopen libcuda.so.1")

    monkeypatch.setattr(cuda, "cudart", lambda: SimpleNamespace(cudaGetDeviceCount=no_libcuda))
    with pytest.raises(CudaUnavailableError, match=r"cannot load the NVIDIA driver \(Failed to dlopen libcuda.so.1\)"):
        gpu_info()


def test_an_insufficient_driver_names_the_extras(monkeypatch) -> None:
    """cuda-python 13 on a CUDA 12 driver (or on no driver) returns cudaErrorInsufficientDriver: the refusal says
    which CUDA it needs and which extras pair cuda-python with the driver's CUDA."""
    monkeypatch.setattr(
        cuda, "cudart", lambda: SimpleNamespace(cudaGetDeviceCount=lambda: (Err.cudaErrorInsufficientDriver, 0))
    )
    monkeypatch.setattr(cuda, "_cuda_python_version", lambda: "13.4.4")
    with pytest.raises(CudaUnavailableError) as refused:
        gpu_info()
    message = str(refused.value)
    assert message.startswith("no usable CUDA GPU: cudaGetDeviceCount failed: cudaErrorInsufficientDriver (35)")
    assert "older than CUDA 13 (cuda-python 13.4.4)" in message and "edgecap[tensorrt-cu12]" in message


def test_allocation_failure_is_a_cuda_error(monkeypatch) -> None:
    monkeypatch.setattr(cuda, "cudart", lambda: fake_cudart(1))
    with pytest.raises(CudaError, match="cudaMalloc"):
        cuda.DeviceBuffer(64)


def test_the_real_cuda_python_without_a_gpu_refuses_clearly() -> None:
    pytest.importorskip("cuda.bindings.runtime", reason="cuda-python is not installed")
    try:
        info = gpu_info()
    except CudaUnavailableError as exc:
        assert "CUDA" in str(exc)
    else:  # a machine with a GPU
        assert info.name and "." in info.compute_capability
