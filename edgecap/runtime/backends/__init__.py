"""Runtime adapters: one :class:`Runtime` interface, backends registered by name and imported only when used.

``RuntimeStepModel`` turns an encoder runtime and a decoder-step runtime into the decoding ``StepModel``, so the
one beam search in ``edgecap.runtime.decoding`` runs on every backend.
"""

from __future__ import annotations

from typing import Any

from edgecap.runtime._lazy import lazy_dir, lazy_getattr
from edgecap.runtime.backends.base import Runtime, RuntimeInputError, RuntimeStateError, TensorMeta, dtype_name
from edgecap.runtime.backends.registry import (
    LoadedRuntime,
    LoadRequest,
    RuntimeLoader,
    RuntimeSpec,
    UnknownRuntimeError,
    auto_runtime,
    canonical_runtime,
    get_runtime,
    list_runtimes,
    register_runtime,
    runtime_available,
)
from edgecap.runtime.precisions import PRECISIONS

_LAZY: dict[str, str] = {
    "RuntimeStepModel": "edgecap.runtime.backends.bridge",
    "RuntimeRefineModel": "edgecap.runtime.backends.refine",
    "create_onnxruntime_refine_model": "edgecap.runtime.backends.onnxruntime.refine",
}

# GPU hints name the CUDA line: an extra of another CUDA major than the driver's installs but cannot start.
_ONNXRUNTIME_INSTALL = (
    "pip install 'edgecap[cpu]' (CPU), or on a GPU machine the extra of its driver's CUDA major: 'edgecap[gpu-cu12]' "
    "or 'edgecap[gpu-cu13]' ('edgecap[gpu]' is CUDA 13); on a Jetson, NVIDIA's onnxruntime-gpu wheel for its JetPack"
)
_TRT_INSTALL = (
    "TensorRT 10 and cuda-python of the driver's CUDA major: pip install 'edgecap[tensorrt-cu12]' or "
    "'edgecap[tensorrt-cu13]' (TensorRT's libraries download from NVIDIA's index, pypi.nvidia.com, during the "
    "install); on JetPack 6, its TensorRT 10.3 (python3-libnvinfer) with cuda-python 12.x and onnx; then build "
    "engines with `edgecap engine BUNDLE`"
)

# The built-in runtimes: a new backend is one module plus one entry like these. The torch runtimes (``torch``,
# ``torch-rerun``) are the workshop half's: it registers them as a plugin (edgecap.workshop.torch_runtime.plugin,
# through the ``edgecap.runtimes`` entry points of pyproject.toml), loaded when the registry is first queried.
register_runtime(
    RuntimeSpec(
        name="onnxruntime",
        description="ONNX Runtime: the bundle's ONNX graphs (TensorRT, CUDA or CPU execution provider)",
        loader="edgecap.runtime.backends.onnxruntime.loader:load_bundle_runtime",
        graph_runtime="edgecap.runtime.backends.onnxruntime.session:OnnxRuntimeSession",
        requires=("onnxruntime",),
        install=_ONNXRUNTIME_INSTALL,
        precisions=PRECISIONS,
        auto_rank=0,
        aliases=("ort",),  # its earlier name; "ort" is also the Object Relation Transformer model family
    )
)
register_runtime(
    RuntimeSpec(
        name="tensorrt",
        description="TensorRT engines built in the bundle by `edgecap engine` (CUDA GPU, cuda-python, no torch)",
        loader="edgecap.runtime.backends.tensorrt.runtime:load_bundle_runtime",
        requires=("tensorrt", "cuda"),
        install=_TRT_INSTALL,
        precisions=PRECISIONS,
        auto_rank=None,  # only by name: engines are built per machine first (edgecap engine)
    )
)


def get_runtime_class(name: str) -> type[Runtime]:
    """Import and return the one-graph :class:`Runtime` class of the runtime registered as ``name``."""
    cls = get_runtime(name).graph_runtime_class()
    if not (isinstance(cls, type) and issubclass(cls, Runtime)):
        raise UnknownRuntimeError(f"runtime {name!r}: {get_runtime(name).graph_runtime} is not a Runtime subclass")
    return cls


def load_runtime(name: str, *args: Any, **kwargs: Any) -> Runtime:
    """Construct the one-graph runtime of ``name`` (not yet activated: use it as a context manager)."""
    return get_runtime_class(name)(*args, **kwargs)


__getattr__ = lazy_getattr(__name__, _LAZY)
__dir__ = lazy_dir(globals(), _LAZY)


__all__ = [
    "LoadRequest",
    "LoadedRuntime",
    "Runtime",
    "RuntimeInputError",
    "RuntimeLoader",
    "RuntimeStateError",
    "RuntimeRefineModel",
    "RuntimeSpec",
    "RuntimeStepModel",
    "TensorMeta",
    "UnknownRuntimeError",
    "auto_runtime",
    "canonical_runtime",
    "create_onnxruntime_refine_model",
    "dtype_name",
    "get_runtime",
    "get_runtime_class",
    "list_runtimes",
    "load_runtime",
    "register_runtime",
    "runtime_available",
]
