"""TensorRT's Python API as edgecap calls it: importing it, starting a ``Builder``/``Runtime``, data types, and the two
kinds of network edgecap builds (a bundle graph through the ONNX parser, and the gather engines).

Kept apart from :mod:`edgecap.runtime.engines.build` (which decides what to build and where it is stored) so every
TensorRT
call of the build sits in one module that ``tests/runtime/engines/test_trt_conformance.py`` checks against NVIDIA's real
bindings. Nothing here imports tensorrt at module level.

Data types go through edgecap's own table (:data:`NUMPY_DTYPES`), not ``trt.nptype``: that raises for ``BF16`` (and
FP8, INT4, FP4) in every TensorRT version, and every engine input and output passes through a numpy host array, so a
type without a numpy dtype is refused when an engine is built and again when one is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from edgecap.runtime.engines.settings import BuildSettings

__all__ = [
    "NUMPY_DTYPES",
    "TRT_INSTALL",
    "EngineBuildError",
    "EngineUnavailableError",
    "build_gather",
    "build_onnx",
    "check_dtypes",
    "load_tensorrt",
    "numpy_dtype",
    "start",
]

TRT_INSTALL = (
    "install TensorRT >= 10.3 for your CUDA: pip install 'edgecap[tensorrt-cu12]' (CUDA 12, TensorRT 10) or "
    "'edgecap[tensorrt-cu13]' (CUDA 13), with NVIDIA's package index (--extra-index-url https://pypi.nvidia.com) for "
    "TensorRT's libraries; on a Jetson, JetPack's system TensorRT (python3-libnvinfer)"
)
#: TensorRT ``DataType`` member names -> numpy dtype names: the types a host array can hold.
NUMPY_DTYPES: dict[str, str] = {"FLOAT": "float32", "HALF": "float16", "INT8": "int8", "INT32": "int32",
                                "INT64": "int64", "BOOL": "bool", "UINT8": "uint8"}  # fmt: skip
_DATA_TYPES = {numpy_name: member for member, numpy_name in NUMPY_DTYPES.items()}
#: What pybind11 says when TensorRT's factory (``createInferBuilder``/``createInferRuntime``) returned NULL.
_NULL_FACTORY = "factory function returned nullptr"
#: Parser errors quoted in a refusal (one per rejected node; the rest are counted).
_SHOWN_ERRORS = 5


class EngineUnavailableError(RuntimeError):
    """TensorRT, cuda-python or a CUDA GPU is missing here, or TensorRT cannot start CUDA."""


class EngineBuildError(RuntimeError):
    """TensorRT could not parse or build a graph, or the bundle cannot give the requested engines."""


def load_tensorrt() -> Any:
    """The ``tensorrt`` module.

    Raises:
        EngineUnavailableError: not installed, or installed without its libraries (the PyPI stub packages).
    """
    try:
        import tensorrt
    except ImportError as exc:
        raise EngineUnavailableError(f"TensorRT is not available ({exc}): {TRT_INSTALL}") from None
    return tensorrt


def start(trt: Any, kind: str) -> Any:
    """``trt.Builder`` or ``trt.Runtime`` (``kind``) with a WARNING logger.

    TensorRT returns NULL from its factory when CUDA cannot start (no driver or GPU, or a driver older than the CUDA
    the wheel was built for), which pybind11 turns into a bare ``TypeError``; that becomes a sentence here.

    Raises:
        EngineUnavailableError: TensorRT could not start CUDA.
    """
    try:
        return getattr(trt, kind)(trt.Logger(trt.Logger.WARNING))
    except TypeError as exc:
        if _NULL_FACTORY not in str(exc):
            raise
    version = getattr(trt, "__version__", "?")
    raise EngineUnavailableError(
        f"TensorRT {version} could not start: CUDA could not be initialised (no driver/GPU, or a CUDA mismatch: the "
        "NVIDIA driver is older than the CUDA this TensorRT was built for, e.g. tensorrt-cu13 on a CUDA 12 driver). "
        f"Check that nvidia-smi sees the GPU; otherwise {TRT_INSTALL}"
    )


def numpy_dtype(data_type: Any) -> np.dtype | None:
    """The numpy dtype of a TensorRT ``DataType`` member, or None when it has none (BF16, FP8, INT4, FP4, …)."""
    name = NUMPY_DTYPES.get(str(getattr(data_type, "name", data_type)))
    return None if name is None else np.dtype(name)


def check_dtypes(specs: Iterable[Any], what: str) -> None:
    """Refuse tensors (``TensorMeta``-like: ``name``, ``dtype`` as a numpy name) whose type no numpy array holds.

    Raises:
        EngineBuildError: one names each such tensor.
    """
    bad = [f"{s.name!r} ({s.dtype})" for s in specs if s.dtype not in _DATA_TYPES]
    if bad:
        raise EngineBuildError(
            f"{what}: {', '.join(bad)} cannot be an engine input or output: edgecap hands every one through a numpy "
            f"array, which holds only {sorted(_DATA_TYPES)} (TensorRT's bfloat16 and FP8 have no numpy type); "
            "export the graphs at fp32, fp16 or int8"
        )


def _config(trt: Any, builder: Any, workspace_mb: int) -> Any:
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_mb) << 20)
    return config


def _add_profile(builder: Any, config: Any, shapes: Mapping[str, tuple[tuple[int, ...], ...]]) -> None:
    profile = builder.create_optimization_profile()
    for name, (low, opt, high) in shapes.items():
        profile.set_shape(name, low, opt, high)
    config.add_optimization_profile(profile)


def _serialize(builder: Any, network: Any, config: Any, what: str) -> bytes:
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineBuildError(f"TensorRT could not build the {what} engine (see the TensorRT log above)")
    return bytes(plan)


def _attach_timing_cache(config: Any, timing: bytes, say: Callable[[str], None]) -> None:
    """Attach the key's timing cache, or a fresh one when TensorRT cannot use it (``create_timing_cache`` gives None
    for a damaged cache, ``set_timing_cache`` False for one from another TensorRT or GPU): a cache only saves time."""
    if timing:
        cache = config.create_timing_cache(timing)
        if cache is not None and config.set_timing_cache(cache, False):
            return
        say("ignoring the timing cache: TensorRT cannot use it (damaged, or from another TensorRT or GPU)")
    cache = config.create_timing_cache(b"")
    if cache is None or not config.set_timing_cache(cache, False):
        raise EngineBuildError("TensorRT could not create an empty timing cache (see the TensorRT log above)")


def build_onnx(
    trt: Any,
    path: str,
    what: str,
    shapes: Mapping[str, tuple[tuple[int, ...], ...]],
    settings: BuildSettings,
    workspace_mb: int,
    timing: bytes,
    say: Callable[[str], None],
) -> tuple[bytes, bytes]:
    """(plan, updated timing cache) of the ONNX graph at ``path`` (``what`` names it in errors), parsed into a network
    created with ``settings.network_flags``, built with its builder flags and one profile of ``shapes``.

    Raises:
        EngineUnavailableError: TensorRT could not start CUDA.
        EngineBuildError: the parser rejected the graph, or TensorRT could not build it.
    """
    builder = start(trt, "Builder")
    network = builder.create_network(settings.network_flags)
    parser = trt.OnnxParser(network, trt.Logger(trt.Logger.WARNING))
    if not parser.parse_from_file(path):
        count = parser.num_errors
        errors = [str(parser.get_error(i)) for i in range(min(count, _SHOWN_ERRORS))]
        more = f"; and {count - _SHOWN_ERRORS} more" if count > _SHOWN_ERRORS else ""
        raise EngineBuildError(f"TensorRT's ONNX parser rejected {what}: {'; '.join(errors) or 'no detail'}{more}")
    config = _config(trt, builder, workspace_mb)
    settings.apply(trt, config)
    _attach_timing_cache(config, timing, say)
    _add_profile(builder, config, shapes)
    plan = _serialize(builder, network, config, what)
    cache = config.get_timing_cache()
    return plan, b"" if cache is None else bytes(cache.serialize())


def build_gather(
    trt: Any,
    states: Sequence[Any],
    shapes: Mapping[str, tuple[tuple[int, ...], ...]],
    workspace_mb: int,
) -> bytes:
    """A network of one ``add_gather`` (axis 0) per state (``TensorMeta``: name, numpy dtype, shape with dimension
    names), all driven by one int32 ``index`` input, with one profile of ``shapes``. Built strongly typed wherever
    TensorRT has the flag, whatever the graphs' precision: a gather moves values and must keep each state's dtype
    exactly, and there is nothing to compute at a lower precision.

    Raises:
        EngineUnavailableError: TensorRT could not start CUDA.
        EngineBuildError: a state without a numpy dtype, or TensorRT could not build the network.
    """
    check_dtypes(states, "the gather engines")
    builder = start(trt, "Builder")
    strong = getattr(getattr(trt, "NetworkDefinitionCreationFlag", None), "STRONGLY_TYPED", None)
    network = builder.create_network(0 if strong is None else 1 << int(strong))
    index = network.add_input("index", trt.DataType.INT32, (-1,))
    for spec in states:
        dims = tuple(-1 if isinstance(d, str) else d for d in spec.shape)
        tensor = network.add_input(spec.name, getattr(trt.DataType, _DATA_TYPES[spec.dtype]), dims)
        gathered = network.add_gather(tensor, index, 0).get_output(0)
        gathered.name = f"{spec.name}_gathered"
        network.mark_output(gathered)
    config = _config(trt, builder, workspace_mb)
    _add_profile(builder, config, shapes)
    return _serialize(builder, network, config, "gather")
