"""CUDA device memory, copies and streams through ``cuda-python`` (no torch, no pycuda), as NVIDIA's own TensorRT
samples do since 10.13.

``cuda-python`` exposes the runtime API as ``cuda.bindings.runtime`` (12.6 and later) or ``cuda.cudart`` (older
releases); every call returns ``(error, *values)``, which :func:`call` turns into a value or a :class:`CudaError`.
Without a usable driver, cuda-python 13.x returns ``cudaErrorInsufficientDriver`` while some 12.x releases raise
``RuntimeError: Failed to dlopen libcuda.so.1`` instead; :func:`gpu_info` turns both into
:class:`CudaUnavailableError`, so ``edgecap engine`` and the ``tensorrt`` runtime refuse in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "CudaError",
    "CudaUnavailableError",
    "DeviceBuffer",
    "GpuInfo",
    "Stream",
    "call",
    "cudart",
    "gpu_info",
    "set_device",
]

_INSTALL = (
    "pip install 'edgecap[tensorrt-cu12]' or 'edgecap[tensorrt-cu13]' (the CUDA major of this machine's driver, as "
    "nvidia-smi shows it); on JetPack 6, cuda-python 12.x"
)
#: ``cudaErrorInsufficientDriver``: no NVIDIA driver, or one older than the CUDA cuda-python is built for.
_INSUFFICIENT_DRIVER = 35


class CudaUnavailableError(RuntimeError):
    """cuda-python is not installed, or no CUDA GPU is visible."""


class CudaError(RuntimeError):
    """A CUDA runtime call failed; the message names the call and CUDA's error, ``code`` is CUDA's error number."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def cudart() -> Any:
    """The CUDA runtime module of cuda-python.

    Raises:
        CudaUnavailableError: cuda-python is not installed, or is installed but does not load.
    """
    try:
        try:
            from cuda.bindings import runtime
        except ImportError:
            from cuda import cudart as runtime
    except ImportError as exc:
        raise CudaUnavailableError(f"the TensorRT runtime needs cuda-python ({exc}): {_INSTALL}") from None
    except (OSError, RuntimeError) as exc:  # installed, but a library it loads on import is missing or broken
        raise CudaUnavailableError(f"cuda-python is installed but does not load ({exc}): {_INSTALL}") from None
    return runtime


def call(result: Any, what: str = "CUDA call") -> Any:
    """The value(s) of a cuda-python call's ``(error, *values)`` result; :class:`CudaError` unless it succeeded."""
    error, *values = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        name = getattr(error, "name", None) or str(error).rsplit(".", 1)[-1]
        raise CudaError(f"{what} failed: {name} ({int(error)})", int(error))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@dataclass(frozen=True)
class GpuInfo:
    """The GPU an engine is built for or runs on: part of the engine cache key."""

    index: int
    name: str
    compute_capability: str

    def slug(self) -> str:
        """The name as a path-safe token (``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"``)."""
        return "-".join("".join(c if c.isalnum() else " " for c in self.name.lower()).split()) or "gpu"


def gpu_info(device: int = 0) -> GpuInfo:
    """Name and compute capability of CUDA device ``device``.

    Raises:
        CudaUnavailableError: cuda-python is missing or does not load, or no CUDA GPU is usable (no driver, a
            driver older than cuda-python's CUDA, none present, ``CUDA_VISIBLE_DEVICES`` empty).
    """
    rt = cudart()
    count = _query(rt.cudaGetDeviceCount, "cudaGetDeviceCount")
    if not count:
        raise CudaUnavailableError("no CUDA GPU is visible (cudaGetDeviceCount returned 0)")
    if not 0 <= device < count:
        raise CudaUnavailableError(f"CUDA device {device} does not exist ({count} visible)")
    props = _query(lambda: rt.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    name = props.name.decode(errors="replace") if isinstance(props.name, bytes) else str(props.name)
    return GpuInfo(device, name.rstrip("\x00").strip(), f"{props.major}.{props.minor}")


def _query(function: Callable[[], Any], what: str) -> Any:
    """``call(function(), what)``, with each way cuda-python says the GPU is unusable as :class:`CudaUnavailableError`:
    an error result, or (some 12.x releases, when libcuda.so.1 cannot be loaded) a ``RuntimeError``."""
    try:
        return call(function(), what)
    except CudaError as exc:
        raise CudaUnavailableError(f"no usable CUDA GPU: {exc}{_driver_hint(exc)}") from None
    except (OSError, RuntimeError) as exc:
        raise CudaUnavailableError(f"no usable CUDA GPU: cuda-python cannot load the NVIDIA driver ({exc})") from None


def _driver_hint(exc: CudaError) -> str:
    """For ``cudaErrorInsufficientDriver``: the CUDA major cuda-python needs, and the extra to use instead (a CUDA 13
    cuda-python on a CUDA 12 driver fails exactly like a machine without a driver)."""
    if exc.code != _INSUFFICIENT_DRIVER:
        return ""
    version = _cuda_python_version()
    cuda = f"CUDA {version.split('.')[0]} (cuda-python {version})" if version else "the CUDA of this cuda-python"
    return f": no NVIDIA driver here, or one older than {cuda}; {_INSTALL}"


def _cuda_python_version() -> str | None:
    from importlib import metadata

    for dist in ("cuda-bindings", "cuda-python"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def set_device(device: int) -> None:
    """Make CUDA device ``device`` the calling thread's current device: TensorRT builds, deserialises and creates
    contexts on it, and ``cudaMalloc``/``cudaStreamCreate`` allocate on it. The current device is per thread, so
    every thread that touches an engine calls this first."""
    call(cudart().cudaSetDevice(int(device)), f"cudaSetDevice({device})")


class Stream:
    """One CUDA stream; every copy and engine launch of a runtime is queued on it."""

    def __init__(self) -> None:
        self._rt = cudart()
        self.handle = call(self._rt.cudaStreamCreate(), "cudaStreamCreate")

    @property
    def ptr(self) -> int:
        """The stream as the integer ``IExecutionContext.execute_async_v3`` takes."""
        return int(self.handle)

    def synchronize(self) -> None:
        call(self._rt.cudaStreamSynchronize(self.handle), "cudaStreamSynchronize")

    def close(self) -> None:
        if self.handle is not None:
            call(self._rt.cudaStreamDestroy(self.handle), "cudaStreamDestroy")
            self.handle = None


class DeviceBuffer:
    """``nbytes`` of device memory, allocated once and reused for every call of a batch shape."""

    def __init__(self, nbytes: int) -> None:
        self._rt = cudart()
        self.nbytes = int(nbytes)
        self.ptr = int(call(self._rt.cudaMalloc(max(self.nbytes, 1)), f"cudaMalloc({self.nbytes})"))

    def upload(self, array: np.ndarray, stream: Stream) -> None:
        """Copy a host array (C-contiguous) into the start of the buffer, asynchronously on ``stream``."""
        if array.nbytes > self.nbytes:
            raise CudaError(f"upload of {array.nbytes} bytes into a {self.nbytes}-byte device buffer")
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        call(
            self._rt.cudaMemcpyAsync(self.ptr, array.ctypes.data, array.nbytes, kind, stream.handle),
            "cudaMemcpyAsync(host to device)",
        )

    def download(self, out: np.ndarray, stream: Stream) -> np.ndarray:
        """Copy the start of the buffer into ``out`` and wait for it (the search reads it next)."""
        if out.nbytes > self.nbytes:
            raise CudaError(f"download of {out.nbytes} bytes from a {self.nbytes}-byte device buffer")
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        call(
            self._rt.cudaMemcpyAsync(out.ctypes.data, self.ptr, out.nbytes, kind, stream.handle),
            "cudaMemcpyAsync(device to host)",
        )
        stream.synchronize()
        return out

    def free(self) -> None:
        if self.ptr:
            call(self._rt.cudaFree(self.ptr), "cudaFree")
            self.ptr = 0
