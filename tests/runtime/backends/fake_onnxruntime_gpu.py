"""``onnxruntime-gpu`` on a machine whose GPU providers cannot start, on top of the real (CPU) onnxruntime.

The CPU build lists no CUDA/TensorRT provider, so it cannot show what a GPU build does when they fail. This module
wraps the real module and changes only what that needs: ``get_available_providers`` lists TensorRT and CUDA, and
``InferenceSession`` behaves as onnxruntime-gpu 1.31.1 does on a machine without TensorRT and without an NVIDIA
driver (measured, see :data:`REAL_OUTPUT`): each GPU provider's library fails to load, the native logger says so on
fd 2, the Python wrapper prints its ``EP Error`` notice on stdout when TensorRT was first and retries with
``["CUDAExecutionProvider", "CPUExecutionProvider"]`` *without provider options*, and the session runs on the CPU.
Everything else (``SessionOptions``, the sessions themselves) is the real module's. ``tests/gpu_fallback`` runs the
same scenarios on the real onnxruntime-gpu wheel, and :func:`surface_mismatches` checks that every name the fake
defines exists on the real module with a compatible signature.
"""

from __future__ import annotations

import inspect
import os
import sys
import types
import weakref
from collections.abc import Sequence
from typing import Any

TRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"

#: What onnxruntime-gpu 1.31.1 printed creating a session with TensorRT, CUDA and CPU on a machine with CUDA 13
#: libraries from NVIDIA's pip packages but no TensorRT and no driver (stderr first, then stdout; colour codes kept, the
#: link in the CUDA warning shortened).
REAL_OUTPUT = (
    "\x1b[1;31m2026-11-28 09:31:30.389202029 [E:onnxruntime:Default, provider_bridge_ort.cc:2430 operator()] "
    "/onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:2043 onnxruntime::Provider& "
    "onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : FAIL : Failed to load library "
    "{capi}/libonnxruntime_providers_tensorrt.so with error: {trt_error}\n\x1b[m\n"
    "\x1b[1;31m2026-11-28 09:31:30.395339716 [E:onnxruntime:Default, provider_bridge_ort.cc:2458 operator()] "
    "/onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:2043 onnxruntime::Provider& "
    "onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : FAIL : Failed to load library "
    "{capi}/libonnxruntime_providers_cuda.so with error: {cuda_error}\n\x1b[m\n"
    "\x1b[0;93m2026-11-28 09:31:30.395363671 [W:onnxruntime:Default, onnxruntime_pybind_state.cc:1295 "
    "CreateExecutionProviderFactoryInstance] Failed to create CUDAExecutionProvider. Require cuDNN 9.* and CUDA 13.*. "
    "Please install all dependencies as mentioned in the GPU requirements page "
    "(<link to onnxruntime's CUDA provider requirements>), make sure they're "
    "in the PATH, and that your GPU is supported.\x1b[m\n",
    "*************** EP Error ***************\n"
    "EP Error /onnxruntime_src/onnxruntime/python/onnxruntime_pybind_state.cc:729 void "
    "onnxruntime::python::RegisterTensorRTPluginsAsCustomOps(PySessionOptions&, const onnxruntime::ProviderOptions&) "
    "Please install TensorRT libraries as mentioned in the GPU requirements page, make sure they're in the PATH or "
    "LD_LIBRARY_PATH, and that your GPU is supported.\n when using {providers}\n"
    "Falling back to ['CUDAExecutionProvider', 'CPUExecutionProvider'] and retrying.\n"
    "****************************************\n",
)
TRT_ERROR = "libnvinfer.so.10: cannot open shared object file: No such file or directory"
CUDA_ERROR = "libcuda.so.1: cannot open shared object file: No such file or directory"


def _names(providers: Sequence[Any] | None) -> list[str]:
    return [p if isinstance(p, str) else p[0] for p in providers or ()]


class FailingGpuOnnxRuntime(types.ModuleType):
    """The real onnxruntime module, as a GPU build whose GPU providers fail to load.

    Attributes:
        calls: the provider entries of every ``InferenceSession`` asked for (as given).
        sessions: weak references to the sessions created for a request that named a GPU provider.
        preloads: how many times ``preload_dlls`` was called.
        pretend_started: providers the fake says started (``get_providers`` lists them) though the CPU runs the
            graph: lets a load go as far as its options on a CPU-only machine, never to inference.
    """

    def __init__(self, real: Any, pretend_started: Sequence[str] = ()) -> None:
        super().__init__("onnxruntime")
        self._real = real
        self.__version__ = real.__version__
        self.__file__ = getattr(real, "__file__", None)
        self.__spec__, self.__path__ = real.__spec__, getattr(real, "__path__", [])  # importlib's checks see the real
        self.calls: list[list[Any]] = []
        self.sessions: list[weakref.ref] = []
        self.preloads = 0
        self.pretend_started = tuple(pretend_started)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def get_available_providers(self) -> list[str]:
        return [TRT, CUDA, *self._real.get_available_providers()]

    def preload_dlls(self, cuda: bool = True, cudnn: bool = True, msvc: bool = True, directory: Any = None) -> None:
        self.preloads += 1

    def InferenceSession(  # noqa: N802  # the real module's class name
        self,
        path_or_bytes: Any,
        sess_options: Any = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[dict] | None = None,
        **kwargs: Any,
    ) -> Any:
        self.calls.append(list(providers or ()))
        names = _names(providers)
        stderr, stdout = REAL_OUTPUT
        capi = os.path.join(os.path.dirname(self.__file__ or "."), "capi")
        fills = {"capi": capi, "trt_error": TRT_ERROR, "cuda_error": CUDA_ERROR, "providers": names}
        gpu = [n for n in names if n in (TRT, CUDA)]
        if gpu and not self.pretend_started:
            lines = stderr.format(**fills).split("\x1b[1;31m")
            if TRT in names:  # the TensorRT load error, then the wrapper's notice and its retry with CUDA
                os.write(2, ("\x1b[1;31m" + lines[1]).encode())
                sys.stdout.write(stdout.format(**fills))
                names, providers = [CUDA, CPU], [CUDA, CPU]
            os.write(2, ("\x1b[1;31m" + lines[2]).encode())  # CUDA: its load error and the factory's warning
        kept = [p for p in (providers or [CPU]) if _names([p])[0] not in (TRT, CUDA)] or [CPU]
        session = self._real.InferenceSession(path_or_bytes, sess_options, providers=kept)
        if gpu:
            self.sessions.append(weakref.ref(session))
        if self.pretend_started:
            return _Pretending(session, [n for n in names if n in self.pretend_started] + _names(kept))
        return session


class _Pretending:
    """A real CPU session that reports the providers the fake pretends started."""

    def __init__(self, session: Any, providers: list[str]) -> None:
        self._session, self._providers = session, providers

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def get_providers(self) -> list[str]:
        return list(self._providers)


def surface_mismatches(fake: FailingGpuOnnxRuntime, real: Any) -> list[str]:
    """What the fake defines that the real module lacks or takes differently (names, then parameter names)."""
    problems = []
    for name in ("get_available_providers", "preload_dlls", "InferenceSession", "__version__"):
        if not hasattr(real, name):
            problems.append(f"onnxruntime has no {name}")
    real_init = getattr(getattr(real, "InferenceSession", None), "__init__", None)
    if real_init is not None:
        wanted = [p for p in inspect.signature(real_init).parameters if p != "self"]
        mine = list(inspect.signature(fake.InferenceSession).parameters)
        if wanted != mine:
            problems.append(f"InferenceSession takes {wanted}, the fake {mine}")
    preload = getattr(real, "preload_dlls", None)
    if preload is not None:
        wanted = list(inspect.signature(preload).parameters)
        mine = list(inspect.signature(fake.preload_dlls).parameters)
        if wanted != mine:
            problems.append(f"preload_dlls takes {wanted}, the fake {mine}")
    session_methods = ("get_providers", "get_provider_options", "get_inputs", "get_outputs", "run", "io_binding")
    missing = [m for m in session_methods if not hasattr(getattr(real, "InferenceSession", object), m)]
    if missing:
        problems.append(f"InferenceSession lacks {missing}")
    return problems
