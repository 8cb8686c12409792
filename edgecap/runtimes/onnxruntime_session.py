"""The ONNX Runtime backend: ``OrtRuntime`` (one ONNX graph in one ``InferenceSession``) and
:func:`create_ort_step_model` (the exported ``init`` + ``step`` graphs as a decoding ``StepModel``).

``onnxruntime`` is imported only when a runtime is constructed, never by ``import edgecap`` /
``import edgecap.runtimes``.

Execution providers: CPU always (last, as the fallback); TensorRT and CUDA first when
``onnxruntime.get_available_providers()`` lists them, or exactly what ``providers=`` asks for.

I/O: two paths behind one interface.

- ``io_binding=False`` (the default on CPU): numpy in, numpy out through ``session.run``. On CPU this is the
  faster path: ORT wraps numpy inputs without a copy and hands its output buffers over as numpy arrays, while
  binding adds per-call bind/clear calls and DLPack wrapping (acort-xsmall beam-3 decode, 1 thread: 15.6 ms/image
  plain vs 17.4 ms/image bound). Only public onnxruntime API is used (``InferenceSession.run``,
  ``run_with_iobinding``, ``OrtValue``): bypassing ``run``'s Python wrapper saves a few µs per call, inside the
  run-to-run spread of a decode (``benchmarks/decode_overhead.py``).
- ``io_binding=True`` (the default with the CUDA/TensorRT providers): torch tensors in and out, bound by device
  pointer; outputs are allocated by ORT on the device and returned zero-copy through DLPack, so a decode loop's
  cache never crosses PCIe and beam reordering is a device ``index_select`` (``array_type = "torch"``). The same
  code path runs on CPU, which is how the tests exercise it (no GPU in CI).
"""

from __future__ import annotations

import importlib.util
import logging
import operator
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.decoding.parallel import in_decode_chunk
from edgecap.runtimes.base import Array, Runtime, RuntimeInputError, TensorMeta
from edgecap.runtimes.threads import ThreadPlan, WidePlan, plan_threads

log = logging.getLogger(__name__)

__all__ = [
    "PROVIDERS",
    "PROVIDER_ALIASES",
    "OrtProviderError",
    "OrtRuntime",
    "ProviderInfo",
    "create_ort_step_model",
    "resolve_providers",
]


@dataclass(frozen=True)
class ProviderInfo:
    """What edgecap knows about one execution provider; provider and precision choice read this table, so supporting
    another provider is one entry in :data:`PROVIDERS`.

    Attributes:
        name: onnxruntime's name (``"CUDAExecutionProvider"``).
        label: how reasons and reports name it.
        aliases: short names accepted in ``providers=``.
        device: where its tensors live (``"cuda"`` or ``"cpu"``).
        auto: tried automatically when this onnxruntime build has it (CPU is always appended as the fallback).
        precisions: what ``precision="auto"`` takes on it, best first, among the variants the bundle holds.
        int8_suits: ``(INT8 variant entry) -> (runs correctly here, why)``; None = INT8 is never chosen on it.
    """

    name: str
    label: str
    aliases: tuple[str, ...]
    device: str
    auto: bool
    precisions: tuple[str, ...]
    int8_suits: Callable[[Mapping[str, Any]], tuple[bool, str]] | None = None


# ONNX tensor type strings (``NodeArg.type``) -> numpy dtype names.
_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(bfloat16)": "bfloat16",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int16)": "int16",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}

ModelSource = str | os.PathLike | bytes | Any  # Any: an onnx.ModelProto (anything with SerializeToString)


class OrtProviderError(ValueError):
    """An execution provider that is unknown or not available in this onnxruntime build."""


def resolve_providers(requested: Sequence[str] | str | None, available: Sequence[str]) -> list[str]:
    """The provider list a session gets.

    Args:
        requested: None = automatic (TensorRT, CUDA when available, then CPU); otherwise names or aliases
            (``"cpu"``, ``"cuda"``, ``"tensorrt"``/``"trt"``) in priority order. CPU is appended when missing.
        available: ``onnxruntime.get_available_providers()``.

    Raises:
        OrtProviderError: a requested provider is unknown or not available here.
    """
    if requested is None:
        chosen = [p for p in _AUTO_PROVIDERS if p in available]
    else:
        names = [requested] if isinstance(requested, str) else list(requested)
        chosen = [PROVIDER_ALIASES.get(str(p).lower(), str(p)) for p in names]
        missing = [p for p in chosen if p not in available]
        if missing:
            raise OrtProviderError(
                f"execution provider(s) {missing} are not available in this onnxruntime build "
                f"(available: {list(available)}); install onnxruntime-gpu for CUDA/TensorRT"
            )
    chosen = list(dict.fromkeys(chosen))
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise ImportError(
            "the 'onnxruntime' runtime needs onnxruntime: pip install 'edgecap[cpu]' (CPU) or 'edgecap[gpu]' (CUDA); "
            "on a Jetson install JetPack's onnxruntime-gpu wheel"
        ) from exc
    return onnxruntime


class OrtRuntime(Runtime):
    """One ONNX graph in one ``onnxruntime.InferenceSession`` (created once, on activation), plus on CPU an optional
    *wide* session on the same graph for large calls (``wide=``; created on the first call that reaches its rows).

    Args:
        model: an ``.onnx`` path, serialized bytes or an ``onnx.ModelProto``.
        providers: see :func:`resolve_providers`.
        provider_options: provider name (or alias) -> options dict, e.g. ``{"cuda": {"device_id": 1}}`` or
            ``{"tensorrt": {"trt_engine_cache_enable": True, "trt_engine_cache_path": "cache/"}}``.
        intra_op_threads: threads inside one op (ORT default: one per physical core; ``Captioner.load`` chooses
            with :func:`edgecap.runtimes.threads.plan_threads`).
        inter_op_threads: threads across independent ops (used with ``execution_mode="parallel"``).
        execution_mode: ``"sequential"`` (default) or ``"parallel"``.
        graph_optimization_level: ``"disable"``, ``"basic"``, ``"extended"`` or ``"all"`` (default; in-memory only,
            the file on disk stays portable).
        session_config: extra ``SessionOptions.add_session_config_entry`` pairs, e.g.
            ``{"session.intra_op.allow_spinning": "0"}`` on a CPU shared with other processes.
        io_binding: bind torch tensors by pointer (see the module docstring); default True exactly when a CUDA-class
            provider is first. Decides :attr:`array_type` (``"torch"`` with binding, else ``"numpy"``).
        device_id: the CUDA device of CUDA/TensorRT providers.
        trt_profile_dims: with the TensorRT provider, bounds of the graph's named dynamic dimensions (a bundle's
            ``interface.dims``): the session gets explicit optimisation profiles for its own inputs
            (:func:`edgecap.runtimes.onnxruntime_gpu.trt_profile_shapes`), read from a metadata-only CPU session first.
        wide: a second, multi-threaded session for calls of at least ``wide.threshold(role)`` rows (the leading
            dimension of the feed's ``batch`` input), created lazily on the first such call; ``threads="auto"`` sets
            it on free cores (:class:`edgecap.runtimes.threads.WidePlan`). Same graph, same outputs. CPU only:
            ignored when a CUDA-class provider is first.
        role: the graph's role in a captioner (``"encoder"``, ``"step"``, ``"refine"``), which picks the wide
            session's threshold; None = the graph's ``graph_role`` metadata (``"init"`` counts as the encoder).
        name: for messages; default the file name.
    """

    def __init__(
        self,
        model: ModelSource,
        *,
        providers: Sequence[str] | str | None = None,
        provider_options: Mapping[str, Mapping[str, Any]] | None = None,
        intra_op_threads: int | None = None,
        inter_op_threads: int | None = None,
        execution_mode: str = "sequential",
        graph_optimization_level: str = "all",
        session_config: Mapping[str, str] | None = None,
        io_binding: bool | None = None,
        device_id: int = 0,
        trt_profile_dims: Mapping[str, Mapping[str, int]] | None = None,
        wide: WidePlan | None = None,
        role: str | None = None,
        name: str | None = None,
    ) -> None:
        if isinstance(model, (str, os.PathLike)):
            path = Path(model)
            if not path.is_file():
                raise FileNotFoundError(f"ONNX model not found: {path}")
            self._source: bytes | str = str(path)
            default_name = f"OrtRuntime({path.name})"
        elif isinstance(model, (bytes, bytearray)):
            self._source = bytes(model)
            default_name = "OrtRuntime(<bytes>)"
        elif hasattr(model, "SerializeToString"):
            self._source = model.SerializeToString()
            graph_role = {p.key: p.value for p in getattr(model, "metadata_props", [])}.get("graph_role")
            default_name = f"OrtRuntime({graph_role or '<model>'})"
        else:
            raise TypeError(f"OrtRuntime model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}")
        super().__init__(name or default_name)
        for label, value in (("intra_op_threads", intra_op_threads), ("inter_op_threads", inter_op_threads)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{label} must be an integer >= 0 (0 = ORT default), got {value!r}")
        if wide is not None and not isinstance(wide, WidePlan):
            raise TypeError(f"wide must be an edgecap.runtimes.threads.WidePlan or None, got {type(wide).__name__}")
        if execution_mode not in ("sequential", "parallel"):
            raise ValueError(f"execution_mode must be 'sequential' or 'parallel', got {execution_mode!r}")
        if graph_optimization_level not in ("disable", "basic", "extended", "all"):
            raise ValueError(
                f"graph_optimization_level must be disable/basic/extended/all, got {graph_optimization_level!r}"
            )
        ort = _ort()
        self.providers = resolve_providers(providers, ort.get_available_providers())
        self.provider_options = {
            PROVIDER_ALIASES.get(k.lower(), k): dict(v) for k, v in dict(provider_options or {}).items()
        }
        unused = [k for k in self.provider_options if k not in self.providers]
        if unused:
            raise OrtProviderError(f"provider_options given for {unused}, which are not in providers {self.providers}")
        self.intra_op_threads, self.inter_op_threads = intra_op_threads, inter_op_threads
        self.execution_mode, self.graph_optimization_level = execution_mode, graph_optimization_level
        self.session_config = {str(k): str(v) for k, v in dict(session_config or {}).items()}
        self.device_id = device_id
        self.trt_profile_dims = None if trt_profile_dims is None else dict(trt_profile_dims)
        self.device_type = "cuda" if self.providers[0] in _CUDA_PROVIDERS else "cpu"
        if io_binding is None:  # device-resident caches need torch for the beam gather on the device
            io_binding = self.device_type == "cuda" and importlib.util.find_spec("torch") is not None
        self.io_binding = bool(io_binding)
        self.array_type = "torch" if self.io_binding else "numpy"  # type: ignore[misc]  # per instance
        self._session: Any = None
        self._binding: Any = None
        self._output_names: tuple[str, ...] = ()
        self._output_list: list[str] = []
        self._inputs: dict[str, TensorMeta] = {}
        self._fast_checks: tuple[tuple[str, Any, Any, Any, int], ...] | None = None
        self.wide = wide if self.device_type == "cpu" else None
        self.role = role
        self._wide_session: Any = None
        self._wide_lock = threading.Lock()
        #: (input whose leading dimension counts the rows, rows from which a call runs wide); None = never wide.
        self._wide_rule: tuple[str, int] | None = None
        #: Calls that ran on the wide session (of :attr:`inference_count`).
        self.wide_inference_count = 0
        #: What the session was given, read back from its ``SessionOptions`` (filled when the session is made); the
        #: wide session's settings appear under ``"wide"`` once it exists.
        self.session_settings: dict[str, Any] = {}

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def _session_options(self, ort: Any, wide: WidePlan | None = None) -> Any:
        """The narrow session's options, or with ``wide`` the wide one's (its threads and spinning, one inter-op
        thread, everything else alike, ``session_config`` included)."""
        options = ort.SessionOptions()
        intra, inter = (wide.intra_op, 1) if wide is not None else (self.intra_op_threads, self.inter_op_threads)
        if intra is not None:
            options.intra_op_num_threads = intra
        if inter is not None:
            options.inter_op_num_threads = inter
        options.execution_mode = (
            ort.ExecutionMode.ORT_PARALLEL if self.execution_mode == "parallel" else ort.ExecutionMode.ORT_SEQUENTIAL
        )
        options.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.graph_optimization_level]
        # The wide session spins as its plan says, unless ``session_config`` names the entries (explicit values win).
        config = {**(wide.session_config() if wide is not None else {}), **self.session_config}
        for key, value in config.items():
            options.add_session_config_entry(key, value)
        return options

    def _provider_entries(self, ort: Any = None) -> list[tuple[str, dict[str, Any]]]:
        entries = []
        for provider in self.providers:
            options = dict(self.provider_options.get(provider, {}))
            if provider in _CUDA_PROVIDERS:
                options.setdefault("device_id", self.device_id)
            if provider == "TensorrtExecutionProvider" and self.trt_profile_dims and ort is not None:
                options.update(self._trt_profiles(ort, options))
            entries.append((provider, options))
        return entries

    def _trt_profiles(self, ort: Any, options: Mapping[str, Any]) -> dict[str, str]:
        """Profile options for this graph's inputs (none when given explicitly, or when a dimension is unbounded:
        the EP then builds engines per shape, slower to warm up but correct)."""
        from edgecap.runtimes.onnxruntime_gpu import TRT_OPTION_SINCE, ort_version_tuple, trt_profile_shapes

        if any(k.startswith("trt_profile_") for k in options):
            return {}
        if ort_version_tuple(ort.__version__) < TRT_OPTION_SINCE["trt_profile_min_shapes"]:
            return {}
        probe_options = ort.SessionOptions()
        probe_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        probe = ort.InferenceSession(self._source, probe_options, providers=["CPUExecutionProvider"])
        inputs = {i.name: [_dim(d) for d in i.shape] for i in probe.get_inputs()}
        try:
            return trt_profile_shapes(inputs, self.trt_profile_dims or {})
        except ValueError as exc:
            log.warning("%s: no TensorRT optimisation profiles (%s); engines are built per input shape", self.name, exc)
            return {}

    def _activate(self) -> None:
        ort = _ort()
        options = self._session_options(ort)
        self.session_settings = _read_settings(options)
        try:
            self._session = ort.InferenceSession(self._source, options, providers=self._provider_entries(ort))
        except Exception as exc:  # ORT raises its own exception types (InvalidGraph, Fail, NoSuchFile ...)
            raise RuntimeInputError(f"{self.name}: onnxruntime could not load the model: {exc}") from exc
        self._inputs = {
            i.name: TensorMeta(i.name, _ORT_TYPES.get(i.type, i.type), tuple(_dim(d) for d in i.shape))
            for i in self._session.get_inputs()
        }
        self._output_names = tuple(o.name for o in self._session.get_outputs())
        self._output_list = list(self._output_names)
        checks = tuple(
            (name, _numpy_dtype_or_none(meta.dtype), *_fixed_sizes(meta.shape), len(meta.shape))
            for name, meta in self._inputs.items()
        )
        # An input without a numpy dtype (bfloat16) always takes the full check.
        self._fast_checks = checks if all(check[1] is not None for check in checks) else None
        self._wide_rule = self._rows_rule()
        # One IOBinding per thread: a binding holds the bound buffers of one run, and a Captioner may be called
        # from several threads at once (ORT sessions themselves are thread-safe).
        self._binding = threading.local() if self.io_binding else None

    def _rows_rule(self) -> tuple[str, int] | None:
        """(input counting the rows, threshold) of the wide session, or None: no wide plan, a role without a
        threshold, or no input with a dynamic leading dimension (``batch`` preferred)."""
        if self.wide is None:
            return None
        role = self.role
        if role is None:  # still activating: read the session directly
            role = self._session.get_modelmeta().custom_metadata_map.get("graph_role")
            role = "encoder" if role == "init" else role
        threshold = self.wide.threshold(role)
        leading = [m.name for m in self._inputs.values() if m.shape and not isinstance(m.shape[0], int)]
        named = [m.name for m in self._inputs.values() if m.shape and m.shape[0] == "batch"]
        if threshold is None or not leading:
            return None
        return (named or leading)[0], threshold

    def _wide_or_none(self, feed: Mapping[str, Array]) -> Any:
        """The wide session when this call's rows reach its threshold (created on first need), else None; never
        inside one chunk of a split decode (the other chunks hold the other cores)."""
        rule = self._wide_rule
        if rule is None or in_decode_chunk():
            return None
        value = feed.get(rule[0])
        shape = getattr(value, "shape", None)
        if not shape or int(shape[0]) < rule[1]:
            return None
        session = self._wide_session
        if session is None:
            with self._wide_lock:  # several decoding threads may reach the threshold at once: create it once
                session = self._wide_session
                if session is None:
                    session = self._wide_session = self._open_wide(rule[1])
        return session

    def _open_wide(self, rows: int) -> Any:
        ort, wide = _ort(), self.wide
        if wide is None:  # a rows rule exists only with a wide plan
            raise RuntimeError(f"{self.name}: no wide plan")
        options = self._session_options(ort, wide)
        settings = _read_settings(options)
        try:
            session = ort.InferenceSession(self._source, options, providers=self._provider_entries(ort))
        except Exception as exc:
            raise RuntimeInputError(f"{self.name}: onnxruntime could not load the model (wide session): {exc}") from exc
        self.session_settings = {**self.session_settings, "wide": settings}
        log.info("%s: wide session (%d threads) for calls from %d rows", self.name, wide.intra_op, rows)
        return session

    def _close(self) -> None:
        self._binding = None
        self._fast_checks = None
        self._session = None
        self._wide_session = None
        self._wide_rule = None
        self.session_settings.pop("wide", None)

    # -- queries -----------------------------------------------------------------------------------------------------
    def _input_metadata(self) -> Mapping[str, TensorMeta]:
        return self._inputs

    @property
    def output_names(self) -> tuple[str, ...]:
        """Graph output names (available once active)."""
        self._require_active("output_names")
        return self._output_names

    @property
    def session(self) -> Any:
        """The underlying ``InferenceSession`` (for profiling or provider queries)."""
        self._require_active("session")
        return self._session

    @property
    def wide_session(self) -> Any:
        """The wide ``InferenceSession``, or None until a call has needed it (or without a wide plan)."""
        self._require_active("wide_session")
        return self._wide_session

    def providers_in_use(self) -> list[str]:
        """The providers the session actually registered (ORT drops ones that failed to initialise)."""
        return list(self.session.get_providers())

    def metadata(self) -> dict[str, str]:
        """The graph's ``metadata_props`` (edgecap writes opset, precision, graph role, model name …)."""
        return dict(self.session.get_modelmeta().custom_metadata_map)

    # -- inference ---------------------------------------------------------------------------------------------------
    def check_feed(self, feed: Mapping[str, Array]) -> None:
        """The base class's check with a fast path for the decode loop: numpy arrays of the declared dtype, rank and
        fixed sizes pass with a few comparisons (the generic check costs ~20 µs per input, a visible share of a
        0.3 ms step); anything else goes through the full check and its error messages."""
        checks = self._fast_checks
        if checks is not None and len(feed) == len(checks):
            get = feed.get
            for name, dtype, fixed_of, fixed, rank in checks:
                value = get(name)  # None (a missing name) fails the type test: the full check names it
                if type(value) is not np.ndarray or value.dtype != dtype or value.ndim != rank:
                    break
                if fixed_of is not None and fixed_of(value.shape) != fixed:
                    break
            else:
                return
        super().check_feed(feed)

    def _infer(self, feed: Mapping[str, Array]) -> dict[str, Array]:
        wide = self._wide_or_none(feed) if self._wide_rule is not None else None
        if wide is not None:
            self.wide_inference_count += 1
        if self._binding is not None:
            return self._infer_bound(feed, wide)
        for value in feed.values():
            if type(value) is not np.ndarray:  # e.g. torch tensors (an unchecked feed): convert every input
                feed = {name: _as_numpy(v) for name, v in feed.items()}
                break
        outputs = (wide or self._session).run(self._output_list, feed)
        return dict(zip(self._output_names, outputs, strict=True))

    def _infer_bound(self, feed: Mapping[str, Array], wide: Any = None) -> dict[str, Array]:
        import torch

        session, slot = (wide, "wide") if wide is not None else (self._session, "value")
        binding = getattr(self._binding, slot, None)
        if binding is None:  # one per thread and session
            binding = session.io_binding()
            setattr(self._binding, slot, binding)
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        device = torch.device(self.device_type, self.device_id) if self.device_type == "cuda" else torch.device("cpu")
        keep_alive = []
        for name, value in feed.items():
            tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
            tensor = tensor.detach().to(device).contiguous()
            keep_alive.append(tensor)
            binding.bind_input(
                name,
                self.device_type,
                self.device_id,
                _numpy_dtype(tensor.dtype),
                tuple(tensor.shape),
                tensor.data_ptr(),
            )
        for name in self._output_names:
            binding.bind_output(name, self.device_type, self.device_id)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # inputs written by torch kernels must be complete
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        values = binding.get_outputs()
        return {name: _to_torch(value, device) for name, value in zip(self._output_names, values, strict=True)}


def _to_torch(value: Any, device: Any) -> Any:
    """An output OrtValue as a torch tensor, without leaving the device where the API allows:

    - DLPack (``OrtValue.__dlpack__``, in current releases): zero-copy;
    - else, for a CUDA output (onnxruntime builds whose OrtValue lacks DLPack, such as some 1.18–1.20 wheels Jetson
      users get): zero-copy through the CUDA Array Interface built from ``data_ptr()``/``shape()``/``data_type()``,
      which every release since 1.8 has; the wrapper holds the OrtValue, so ORT's buffer lives as long as the tensor;
    - else (a CPU output): through numpy.
    """
    import torch

    if hasattr(value, "__dlpack__"):
        return torch.from_dlpack(value)
    if getattr(device, "type", None) == "cuda" and callable(getattr(value, "data_ptr", None)):
        shape = tuple(int(d) for d in value.shape())
        dtype = np.dtype(_ORT_TYPES[value.data_type()])
        if 0 in shape:  # an empty tensor may have no buffer at all
            return torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, device=device)
        return torch.as_tensor(_CudaArray(value, shape, dtype), device=device)
    return torch.from_numpy(value.numpy()).to(device)


class _CudaArray:
    """An ORT-owned CUDA buffer as a CUDA Array Interface (v2) object; keeps the OrtValue alive."""

    def __init__(self, value: Any, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.value = value
        self.__cuda_array_interface__ = cuda_array_interface(int(value.data_ptr()), shape, dtype)


def cuda_array_interface(pointer: int, shape: Sequence[int], dtype: Any) -> dict[str, Any]:
    """The CUDA Array Interface (version 2) of a C-contiguous device buffer: what ``torch.as_tensor`` reads to wrap
    device memory it does not own (no stream field: the caller synchronised the producer)."""
    dtype = np.dtype(dtype)
    return {"shape": tuple(int(d) for d in shape), "typestr": dtype.str, "data": (int(pointer), False), "version": 2}


def _read_settings(options: Any) -> dict[str, Any]:
    """The threading a ``SessionOptions`` carries, read back from it (not from what was asked): intra/inter-op
    threads (0 = ORT's default), execution mode, and the spinning entries (None = not set: ORT spins)."""
    from edgecap.runtimes.threads import SPIN_KEYS

    settings: dict[str, Any] = {
        "intra_op_threads": int(options.intra_op_num_threads),
        "inter_op_threads": int(options.inter_op_num_threads),
        "execution_mode": "parallel" if "PARALLEL" in str(options.execution_mode) else "sequential",
    }
    for key in SPIN_KEYS:
        try:
            settings[key] = options.get_session_config_entry(key)
        except Exception:  # onnxruntime raises a plain RuntimeError/Fail for an entry that was never set
            settings[key] = None
    return settings


def _numpy_dtype_or_none(name: str) -> np.dtype | None:
    try:
        return np.dtype(name)
    except TypeError:  # e.g. bfloat16: no numpy dtype, always take the full check
        return None


def _fixed_sizes(shape: tuple[Any, ...]) -> tuple[Any, Any]:
    """(getter, sizes) of the fixed (integer) dimensions of a declared shape: ``getter(actual_shape) == sizes``
    exactly when every fixed dimension matches (the rank is checked first); ``(None, None)`` when none is fixed."""
    axes = [axis for axis, size in enumerate(shape) if isinstance(size, int)]
    if not axes:
        return None, None
    getter = operator.itemgetter(*axes)
    return getter, getter(shape)


def _dim(value: Any) -> int | str | None:
    return value if isinstance(value, (int, str)) else None


def _as_numpy(value: Array) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    detach = getattr(value, "detach", None)
    if detach is not None:  # a torch tensor
        return detach().cpu().numpy()
    return np.asarray(value)


def _numpy_dtype(torch_dtype: Any) -> Any:
    import torch

    if torch_dtype == torch.bool:
        return np.bool_
    return torch.empty((), dtype=torch_dtype).numpy().dtype.type


def create_ort_step_model(
    encoder: ModelSource,
    step: ModelSource,
    state_names: Sequence[str] | None = None,
    updated_state_names: Sequence[str] | None = None,
    *,
    decode_workers: int = 1,
    **runtime_options: Any,
) -> Any:
    """A :class:`~edgecap.runtimes.bridge.RuntimeStepModel` over the exported ``init`` (encoder + start) and ``step``
    graphs, so ``edgecap.decoding.decode`` runs on ONNX Runtime unchanged.

    Args:
        encoder: the runtime encoder graph (``ExportResult.runtime_models()["encoder"]``, i.e. ``init.onnx``): decode
            inputs -> the initial state.
        step: the step graph: ``tokens`` + state -> ``logprobs`` + ``<state>_out``.
        state_names: state order; default read from the step graph's ``state_names`` metadata (written by export),
            else its inputs other than ``tokens``.
        updated_state_names: the states the step graph outputs; default read from its ``updated_state_names``
            metadata, else all.
        decode_workers: concurrent chunks a batch decodes in (``ThreadPlan.decode_workers``; 1 = one decode).
        **runtime_options: :class:`OrtRuntime` options for both sessions (``providers``, ``intra_op_threads`` …).

    Use it as a context manager (``with create_ort_step_model(...) as sm: decode(sm, inputs, cfg)``); both sessions
    are created once on entry.
    """
    from edgecap.runtimes.bridge import RuntimeStepModel

    if state_names is None or updated_state_names is None:
        meta_names, meta_updated = _state_names_of(step)
        state_names = meta_names if state_names is None else state_names
        updated_state_names = meta_updated if updated_state_names is None else updated_state_names
    return RuntimeStepModel(
        OrtRuntime(encoder, name="ort-encoder", role="encoder", **runtime_options),
        OrtRuntime(step, name="ort-step", role="step", **runtime_options),
        tuple(state_names),
        updated_state_names=updated_state_names,
        decode_workers=decode_workers,
    )


def _state_names_of(step: ModelSource) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """(state names, updated state names or None = all) from the step graph's metadata or its inputs."""
    try:
        import onnx
    except ImportError as exc:
        raise ImportError("reading state names from a graph needs onnx; pass state_names= instead") from exc
    model = step if hasattr(step, "graph") else onnx.load_from_string(step) if isinstance(step, bytes) else None
    if model is None:
        model = onnx.load(os.fspath(step), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    updated = tuple(meta["updated_state_names"].split(",")) if meta.get("updated_state_names") else None
    if meta.get("state_names"):
        return tuple(meta["state_names"].split(",")), updated
    initializers = {t.name for t in model.graph.initializer}
    names = tuple(i.name for i in model.graph.input if i.name != "tokens" and i.name not in initializers)
    return names, updated


# -- bundles on ONNX Runtime (the registry's loader) ------------------------------------------------------------------
def load_bundle_runtime(bundle: Any, request: Any) -> Any:
    """A bundle's graphs of one precision in ONNX Runtime sessions, for ``Captioner.load(runtime="onnxruntime")``.

    Providers: TensorRT, then CUDA when this onnxruntime build has them, then CPU (or ``request.providers``).
    Precision ``"auto"``: INT8 with TensorRT when the bundle has a TensorRT-calibrated variant, FP16 on
    CUDA/TensorRT, INT8 on a CPU whose instructions suit the variant's preset, else FP32. The graphs' checksums are
    verified before the sessions open, and their input/output names are checked against the bundle's interface
    from the sessions' own metadata (the graphs are parsed once, by onnxruntime).

    Returns:
        A :class:`~edgecap.runtimes.registry.LoadedRuntime`; its ``info`` says which provider and precision were
        chosen and why.
    """
    from edgecap.runtimes.decoders import create_ort_decoder
    from edgecap.runtimes.images import image_inputs
    from edgecap.runtimes.registry import LoadedRuntime

    available = list(_ort().get_available_providers())
    chosen = resolve_providers(request.providers, available)
    primary = chosen[0]
    if request.providers is None:
        provider_reason = f"{primary}: the best provider present (TensorRT, then CUDA, then CPU; available {available})"
    else:
        provider_reason = "requested"
    precision = request.precision
    if precision == "auto":
        precision, reason = _auto_precision(bundle.precisions, primary, bundle.manifest["variants"].get("int8"))
    else:
        bundle.variant(precision)  # refuses, naming what the bundle holds
        reason = "requested"
        if precision == "int8" and primary == "CPUExecutionProvider":
            ok, why = _cpu_can_run_int8(bundle.variant("int8"))
            if not ok:
                log.warning("%s; captions may be degraded (re-export with --target cpu-auto on this machine)", why)
    if request.verify:
        bundle.verify(bundle.used_files(precision))
    roles = bundle.interface["runtime_graphs"]
    graphs = {role: bundle.graph_path(precision, role) for role in roles}
    plan, thread_options = _thread_options(request, primary, graphs)
    options: dict[str, Any] = {"providers": chosen, **thread_options}
    if "TensorrtExecutionProvider" in chosen:
        options["provider_options"] = {"tensorrt": _tensorrt_options(bundle, precision)}
        options["trt_profile_dims"] = bundle.interface.get("dims")
    if plan is not None and plan.decode_workers > 1 and set(graphs) == {"encoder", "step"}:
        options["decode_workers"] = plan.decode_workers
    coupled = _row_coupled_roles(bundle, precision)
    step_model = create_ort_decoder(
        graphs,
        bundle.state_names,
        updated_state_names=bundle.updated_state_names,
        rows_independent=not coupled,
        **options,
    )
    step_model.__enter__()
    try:
        _check_sessions(bundle, step_model, graphs)
        in_use = step_model.encoder.providers_in_use()
        on_gpu = in_use[0] in _CUDA_PROVIDERS
        inputs, backbone, no_images = image_inputs(
            bundle, request.device or ("cuda" if on_gpu else "cpu"), bundle.backbone_in_graph
        )
    except BaseException:
        step_model.__exit__(None, None, None)
        raise
    info = {
        "providers": in_use,
        "provider_reason": provider_reason,
        "device": "cuda" if on_gpu else "cpu",
        "precision": precision,
        "precision_reason": reason,
        "backbone": backbone,
    }
    if plan is not None:
        info["threads"] = plan.as_dict()
    if precision == "int8":
        info["int8_schemes"] = {role: r["scheme"] for role, r in bundle.int8_schemes().items()}
    info["per_image_decode"] = bool(coupled)
    if coupled:
        info["per_image_reason"] = (
            f"the INT8 {'/'.join(coupled)} graph quantises activations with one scale per call (dynamic): each image "
            "is decoded on its own, so its caption does not depend on its batch (slower on batches)"
        )
    return LoadedRuntime(step_model, inputs, info, [step_model], no_images)


def _thread_options(request: Any, primary: str, graphs: Mapping[str, Path]) -> tuple[ThreadPlan | None, dict[str, Any]]:
    """The thread plan (None off the CPU) and the :class:`OrtRuntime` keyword arguments of a load request.

    On CPU the whole plan applies. On CUDA/TensorRT the CPU threads only feed the device, so the policy does not
    run; an explicit thread count >= 1 or an explicit ``spin`` still applies (an explicit value always wins).
    """
    if primary == "CPUExecutionProvider":
        plan = plan_threads(request.threads, request.spin, streams=request.streams, step_bytes=_step_bytes(graphs))
        log.info("ONNX Runtime threads: %s (%s)", plan.describe(), plan.reason)
        return plan, plan.runtime_options()
    options: dict[str, Any] = {}
    if isinstance(request.threads, int) and request.threads > 0:
        options["intra_op_threads"] = request.threads
    if request.spin is not None:
        options["session_config"] = plan_threads(
            request.threads, request.spin, streams=request.streams
        ).session_config()
    return None, options


def _step_bytes(graphs: Mapping[str, Path]) -> int:
    """Size on disk of the graph run once per token (``step`` or ``refine``): about the weights each step reads."""
    loop = next(role for role in graphs if role != "encoder")
    return Path(graphs[loop]).stat().st_size


def _check_sessions(bundle: Any, step_model: Any, graphs: Mapping[str, Path]) -> None:
    """Each session's input/output names against the bundle's interface (role -> session from the adapter)."""
    loop = next(role for role in graphs if role != "encoder")
    for role, runtime in (("encoder", step_model.encoder), (loop, step_model.loop_runtime)):
        bundle.check_interface(role, list(runtime.input_metadata()), runtime.output_names, graphs[role])


def _deployment(variant: Mapping[str, Any]) -> Mapping[str, Any]:
    """Where the INT8 variant's graphs may run, as its preset recorded it at export (``provider``,
    ``runs_on_any_cpu``); bundles exported before that record get the built-in presets' values by name."""
    recorded = variant.get("deployment")
    if isinstance(recorded, Mapping):
        return recorded
    preset = str(variant.get("preset") or variant.get("target") or "")
    return {"provider": "tensorrt" if preset == "tensorrt" else "cpu", "runs_on_any_cpu": preset == "cpu-avx2"}


#: INT8 schemes whose graphs quantise a call's activations with one scale over all its rows (``dynamic``:
#: ``DynamicQuantizeLinear``), so a row's output depends on the call's other rows. ``static`` scales are fixed at
#: export and ``weight-only`` (``MatMulNBits``) quantises each row's blocks on their own.
ROW_COUPLED_SCHEMES = frozenset({"dynamic"})


def row_coupled_roles(schemes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The roles whose INT8 scheme record (a manifest's ``schemes``) couples a call's rows
    (:data:`ROW_COUPLED_SCHEMES`); a per-image decode runs the encoder and the loop graph image by image."""
    return [r for r in sorted(schemes) if schemes[r].get("scheme") in ROW_COUPLED_SCHEMES]


def _row_coupled_roles(bundle: Any, precision: str) -> list[str]:
    """:func:`row_coupled_roles` of the bundle's variant; empty off INT8."""
    return row_coupled_roles(bundle.int8_schemes()) if precision == "int8" else []


#: (step scheme, bits) -> the first onnxruntime release with CPU kernels for its ops (8-bit ``MatMulNBits``: 1.22).
SCHEME_MIN_ONNXRUNTIME: dict[tuple[str, int], tuple[int, int]] = {("weight-only", 8): (1, 22)}


def _ort_too_old_for(variant: Mapping[str, Any]) -> str | None:
    """Why this onnxruntime cannot run the INT8 variant's recorded schemes, or None when it can."""
    version = tuple(int(p) for p in re.findall(r"\d+", _ort().__version__)[:2])
    for role, record in (variant.get("schemes") or {}).items():
        if not isinstance(record, Mapping):
            continue
        need = SCHEME_MIN_ONNXRUNTIME.get((record.get("scheme"), record.get("bits")))
        if need and version < need:
            return (
                f"the INT8 {role} graph is {record.get('bits')}-bit {record.get('scheme')}, which needs onnxruntime >= "
                f"{need[0]}.{need[1]} (installed: {_ort().__version__})"
            )
    return None


def _cpu_can_run_int8(variant: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether this CPU runs the INT8 variant's preset correctly: a preset built for VNNI (no ``reduce_range``) or for
    ARM (S8S8) saturates on a CPU without those instructions, and a TensorRT (S8S8 symmetric) graph likewise; a
    preset that records ``runs_on_any_cpu`` (``cpu-avx2``) is safe everywhere."""
    from edgecap.runtimes.cpu import detect_cpu_preset

    too_old = _ort_too_old_for(variant)
    if too_old:
        return False, too_old
    preset = str(variant.get("preset") or variant.get("target") or "")
    here = detect_cpu_preset()
    deployment = _deployment(variant)
    if preset == here or (deployment.get("provider") == "cpu" and deployment.get("runs_on_any_cpu")):
        return True, f"INT8 preset {preset} suits this CPU ({here})"
    return False, f"the INT8 variant was quantised for {preset}, this CPU needs {here}"


def _tensorrt_int8(variant: Mapping[str, Any]) -> tuple[bool, str]:
    """TensorRT runs an INT8 variant whose preset records TensorRT as its provider (symmetric S8S8 QDQ)."""
    if _deployment(variant).get("provider") == "tensorrt":
        return True, "TensorRT with an INT8 variant calibrated for TensorRT"
    return False, f"the INT8 variant was quantised for {variant.get('preset') or variant.get('target')}, not TensorRT"


#: The execution providers edgecap chooses among, best first. FP16 is left out on CPU: ONNX Runtime's CPU provider
#: runs FP16 graphs through inserted casts, slower than FP32.
PROVIDERS: tuple[ProviderInfo, ...] = (
    ProviderInfo(
        "TensorrtExecutionProvider", "TensorRT", ("tensorrt", "trt"), "cuda", True, ("int8", "fp16"), _tensorrt_int8
    ),
    ProviderInfo("CUDAExecutionProvider", "CUDA", ("cuda",), "cuda", True, ("fp16",)),
    ProviderInfo("CPUExecutionProvider", "CPU", ("cpu",), "cpu", False, ("int8",), _cpu_can_run_int8),
)
_BY_NAME = {p.name: p for p in PROVIDERS}
#: Short names accepted in ``providers=``.
PROVIDER_ALIASES = {alias: p.name for p in PROVIDERS for alias in p.aliases}
#: Providers preferred when present, best first; CPU is always appended.
_AUTO_PROVIDERS = tuple(p.name for p in PROVIDERS if p.auto)
#: Providers whose tensors live on a CUDA device.
_CUDA_PROVIDERS = frozenset(p.name for p in PROVIDERS if p.device == "cuda")


def _auto_precision(available: Sequence[str], provider: str, int8: Mapping[str, Any] | None) -> tuple[str, str]:
    """The best precision of a bundle for ONNX Runtime's first provider, with the reason: the first of the provider's
    :attr:`ProviderInfo.precisions` the bundle holds (INT8 only when the variant suits the provider), else FP32."""
    info = _BY_NAME.get(provider)
    if info is None:
        return "fp32", f"{provider}: FP32 (edgecap has no precision preference for this provider)"
    passed = []
    for precision in info.precisions:
        if precision == "int8":
            if int8 is None or info.int8_suits is None:
                passed.append("the bundle has no INT8 variant")
                continue
            ok, why = info.int8_suits(int8)
            if ok:
                return "int8", why
            passed.append(why)
        elif precision in available:
            return precision, f"{info.label}: {precision.upper()} graphs"
        else:
            passed.append(f"the bundle has no {precision.upper()} variant")
    return "fp32", f"{info.label}: FP32 ({'; '.join(passed) or 'its preferred precision'})"


def _tensorrt_options(bundle: Any, precision: str) -> dict[str, Any]:
    """TensorRT EP options (:func:`edgecap.runtimes.onnxruntime_gpu.tensorrt_ep_options`): engine and timing caches in
    the bundle's hidden ``.ort-trt`` directory (outside the manifest, so it stays verifiable), keyed by the decoder
    graph's checksum; under ``$EDGECAP_HOME`` when the bundle is read-only."""
    from edgecap._home import edgecap_home
    from edgecap.runtimes.onnxruntime_gpu import tensorrt_cache_dir, tensorrt_ep_options

    decoder_role = next(r for r in bundle.interface["runtime_graphs"] if r != "encoder")  # step or refine
    digest = bundle.manifest["files"][bundle.variant(precision)["files"][decoder_role]]["sha256"]
    cache = tensorrt_cache_dir(bundle.path, precision, digest, edgecap_home())
    cache.mkdir(parents=True, exist_ok=True)
    return tensorrt_ep_options(cache, precision, _ort().__version__)
