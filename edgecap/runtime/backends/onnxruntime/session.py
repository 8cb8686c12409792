"""The ONNX Runtime backend: ``OnnxRuntimeSession`` (one ONNX graph in one ``InferenceSession``) and
:func:`create_onnxruntime_step_model` (the exported ``init`` + ``step`` graphs as a decoding ``StepModel``).

``onnxruntime`` is imported only when a runtime is constructed, never by ``import edgecap`` /
``import edgecap.runtime.backends``. The provider and precision choice live in
:mod:`~edgecap.runtime.backends.onnxruntime.providers`, the GPU-provider fallback in
:mod:`~edgecap.runtime.backends.onnxruntime.fallback`, bundles on sessions (the registry's loader,
:func:`load_bundle_runtime`)
in :mod:`~edgecap.runtime.backends.onnxruntime.loader`; their public names are importable from here too.

Execution providers: CPU always (last, as the fallback); TensorRT and CUDA first when
``onnxruntime.get_available_providers()`` lists them, or exactly what ``providers=`` asks for. A build listing a GPU
provider may still fail to start it (no driver, no TensorRT): ONNX Runtime then runs the session on what did start.
The runtime reads the providers its session got and follows them: device, io-binding, array type and the wide
session are those of the provider that runs, and :attr:`OnnxRuntimeSession.provider_fallback` says what did not
start, why.

I/O: numpy in and out through ``session.run`` (``io_binding=False``, the default on CPU, where it is the faster
path), or torch tensors bound by device pointer (``io_binding=True``, the default when the CUDA/TensorRT providers
run: caches stay on the device, ``array_type = "torch"``); :mod:`~edgecap.runtime.backends.onnxruntime.arrays` says why.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.runtime.backends.base import Array, Runtime, RuntimeInputError, TensorMeta
from edgecap.runtime.backends.onnxruntime.arrays import (
    ONNXRUNTIME_TYPES,
    as_numpy,
    cuda_array_interface,
    dim_of,
    fast_checks,
    passes_fast_checks,
    read_settings,
)
from edgecap.runtime.backends.onnxruntime.fallback import (
    ProviderFallback,
    ProviderFallbackWarning,
    open_session,
)
from edgecap.runtime.backends.onnxruntime.providers import (
    CUDA_PROVIDERS,
    PROVIDER_ALIASES,
    PROVIDERS,
    ROW_COUPLED_SCHEMES,
    SCHEME_MIN_ONNXRUNTIME,
    OnnxRuntimeProviderError,
    ProviderInfo,
    import_onnxruntime,
    resolve_providers,
    row_coupled_roles,
)
from edgecap.runtime.backends.threads import WidePlan
from edgecap.runtime.decoding.parallel import in_decode_chunk
from edgecap.runtime.torch_hooks import RunBoundHook, torch_available, torch_hook

log = logging.getLogger(__name__)

#: A graph a session opens: an ``.onnx`` path, serialized bytes, or an ``onnx.ModelProto`` (anything with
#: ``SerializeToString``).
ModelSource = str | os.PathLike | bytes | Any

__all__ = [
    "ModelSource",
    "PROVIDERS",
    "PROVIDER_ALIASES",
    "ROW_COUPLED_SCHEMES",
    "SCHEME_MIN_ONNXRUNTIME",
    "OnnxRuntimeProviderError",
    "OnnxRuntimeSession",
    "ProviderFallback",
    "ProviderFallbackWarning",
    "ProviderInfo",
    "cuda_array_interface",
    "resolve_providers",
    "row_coupled_roles",
]


class OnnxRuntimeSession(Runtime):
    """One ONNX graph in one ``onnxruntime.InferenceSession`` (created once, on activation), plus on CPU an optional
    *wide* session on the same graph for large calls (``wide=``; created on the first call that reaches its rows).

    Args:
        model: an ``.onnx`` path, serialized bytes or an ``onnx.ModelProto``.
        providers: see :func:`resolve_providers`.
        provider_options: provider name (or alias) -> options dict, e.g. ``{"cuda": {"device_id": 1}}`` or
            ``{"tensorrt": {"trt_engine_cache_enable": True, "trt_engine_cache_path": "cache/"}}``.
        intra_op_threads: threads inside one op (ONNX Runtime's default: one per physical core;
            ``Captioner.load`` chooses with :func:`edgecap.runtime.backends.threads.plan_threads`).
        inter_op_threads: threads across independent ops (used with ``execution_mode="parallel"``).
        execution_mode: ``"sequential"`` (default) or ``"parallel"``.
        graph_optimization_level: ``"disable"``, ``"basic"``, ``"extended"`` or ``"all"`` (default; in-memory only,
            the file on disk stays portable).
        session_config: extra ``SessionOptions.add_session_config_entry`` pairs, e.g.
            ``{"session.intra_op.allow_spinning": "0"}`` on a CPU shared with other processes.
        io_binding: bind torch tensors by pointer (see the module docstring); default True exactly when a CUDA-class
            provider runs (and torch is installed). Decides :attr:`array_type` (``"torch"`` with binding, else
            ``"numpy"``). Until the session exists these attributes describe the requested providers; activation sets
            them from the providers the session got.
        device_id: the CUDA device of CUDA/TensorRT providers.
        trt_profile_dims: with the TensorRT provider, bounds of the graph's named dynamic dimensions (a bundle's
            ``interface.dims``): the session gets explicit optimisation profiles for its own inputs
            (:func:`edgecap.runtime.backends.onnxruntime.gpu.trt_profile_shapes`), read from a metadata-only CPU
            session first.
            Their maximum is the bundle's; TensorRT tunes for ``trt_opt_batch`` images
            (:func:`edgecap.runtime.backends.onnxruntime.gpu.trt_opt_sizes`).
        trt_opt_batch: images per call the profiles are tuned for (None:
            :data:`edgecap.runtime.backends.onnxruntime.gpu.DEFAULT_TRT_OPT_BATCH`).
        trt_beam: the beam width a step graph's rows multiply ``trt_opt_batch`` by.
        wide: a second, multi-threaded session for calls of at least ``wide.threshold(role)`` rows (the leading
            dimension of the feed's ``batch`` input), created lazily on the first such call; ``threads="auto"`` sets
            it on free cores (:class:`edgecap.runtime.backends.threads.WidePlan`). Same graph, same outputs. CPU only:
            ignored when a CUDA-class provider runs.
        role: the graph's role in a captioner (``"encoder"``, ``"step"``, ``"refine"``), which picks the wide
            session's threshold; None = the graph's ``graph_role`` metadata (``"init"`` counts as the encoder).
        name: for messages; default the file name.
        warn_fallback: warn (:class:`ProviderFallbackWarning`) when the session runs without a requested provider;
            a loader that reports the fallback itself turns it off.
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
        trt_opt_batch: int | None = None,
        trt_beam: int = 1,
        wide: WidePlan | None = None,
        role: str | None = None,
        name: str | None = None,
        warn_fallback: bool = True,
    ) -> None:
        if isinstance(model, (str, os.PathLike)):
            path = Path(model)
            if not path.is_file():
                raise FileNotFoundError(f"ONNX model not found: {path}")
            self._source: bytes | str = str(path)
            default_name = f"OnnxRuntimeSession({path.name})"
        elif isinstance(model, (bytes, bytearray)):
            self._source = bytes(model)
            default_name = "OnnxRuntimeSession(<bytes>)"
        elif hasattr(model, "SerializeToString"):
            self._source = model.SerializeToString()
            graph_role = {p.key: p.value for p in getattr(model, "metadata_props", [])}.get("graph_role")
            default_name = f"OnnxRuntimeSession({graph_role or '<model>'})"
        else:
            raise TypeError(
                f"OnnxRuntimeSession model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}"
            )
        super().__init__(name or default_name)
        for label, value in (("intra_op_threads", intra_op_threads), ("inter_op_threads", inter_op_threads)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{label} must be an integer >= 0 (0 = ONNX Runtime's default), got {value!r}")
        if wide is not None and not isinstance(wide, WidePlan):
            raise TypeError(
                f"wide must be an edgecap.runtime.backends.threads.WidePlan or None, got {type(wide).__name__}"
            )
        if execution_mode not in ("sequential", "parallel"):
            raise ValueError(f"execution_mode must be 'sequential' or 'parallel', got {execution_mode!r}")
        if graph_optimization_level not in ("disable", "basic", "extended", "all"):
            raise ValueError(
                f"graph_optimization_level must be disable/basic/extended/all, got {graph_optimization_level!r}"
            )
        onnxruntime = import_onnxruntime()
        self.providers = resolve_providers(providers, onnxruntime.get_available_providers())
        self.provider_options = {
            PROVIDER_ALIASES.get(k.lower(), k): dict(v) for k, v in dict(provider_options or {}).items()
        }
        unused = [k for k in self.provider_options if k not in self.providers]
        if unused:
            raise OnnxRuntimeProviderError(
                f"provider_options given for {unused}, which are not in providers {self.providers}"
            )
        self.intra_op_threads, self.inter_op_threads = intra_op_threads, inter_op_threads
        self.execution_mode, self.graph_optimization_level = execution_mode, graph_optimization_level
        self.session_config = {str(k): str(v) for k, v in dict(session_config or {}).items()}
        self.device_id = device_id
        self.trt_profile_dims = None if trt_profile_dims is None else dict(trt_profile_dims)
        self.trt_opt_batch, self.trt_beam = trt_opt_batch, trt_beam
        self.warn_fallback = warn_fallback
        #: What the session ran without, and why (set on activation; None when every requested provider started).
        self.provider_fallback: ProviderFallback | None = None
        self._io_binding_asked, self._wide_plan = io_binding, wide
        self._entries_in_use: list[tuple[str, dict[str, Any]]] = []
        self._follow(self.providers)  # until the session says what runs
        self._session: Any = None
        self._binding: Any = None
        self._run_bound: RunBoundHook | None = None
        self._output_names: tuple[str, ...] = ()
        self._output_list: list[str] = []
        self._inputs: dict[str, TensorMeta] = {}
        self._fast_checks: tuple[tuple[str, Any, Any, Any, int], ...] | None = None
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
    def _follow(
        self, providers: Sequence[str], provider_options: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        """Device, io-binding, array type and wide plan for the provider that runs first (the requested one until a
        session exists, then the one the session got; ``provider_options`` as the session reports them)."""
        primary = providers[0]
        self.device_type = "cuda" if primary in CUDA_PROVIDERS else "cpu"
        if self.device_type == "cuda" and provider_options and primary in provider_options:
            self.device_id = int(provider_options[primary].get("device_id", self.device_id))
        io_binding = self._io_binding_asked
        if io_binding is None:  # device-resident caches need torch for the beam gather on the device
            io_binding = self.device_type == "cuda" and torch_available()
        self.io_binding = bool(io_binding)
        self.array_type = "torch" if self.io_binding else "numpy"  # type: ignore[misc]  # per instance
        self.wide = self._wide_plan if self.device_type == "cpu" else None

    def _session_options(self, onnxruntime: Any, wide: WidePlan | None = None) -> Any:
        """The narrow session's options, or with ``wide`` the wide one's (its threads and spinning, one inter-op
        thread, everything else alike, ``session_config`` included)."""
        options = onnxruntime.SessionOptions()
        intra, inter = (wide.intra_op, 1) if wide is not None else (self.intra_op_threads, self.inter_op_threads)
        if intra is not None:
            options.intra_op_num_threads = intra
        if inter is not None:
            options.inter_op_num_threads = inter
        options.execution_mode = (
            onnxruntime.ExecutionMode.ORT_PARALLEL
            if self.execution_mode == "parallel"
            else onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        )
        options.graph_optimization_level = {
            "disable": onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.graph_optimization_level]
        # The wide session spins as its plan says, unless ``session_config`` names the entries (explicit values win).
        config = {**(wide.session_config() if wide is not None else {}), **self.session_config}
        for key, value in config.items():
            options.add_session_config_entry(key, value)
        return options

    def _provider_entries(self, onnxruntime: Any = None) -> list[tuple[str, dict[str, Any]]]:
        entries = []
        for provider in self.providers:
            options = dict(self.provider_options.get(provider, {}))
            if provider in CUDA_PROVIDERS:
                options.setdefault("device_id", self.device_id)
            if provider == "TensorrtExecutionProvider" and self.trt_profile_dims and onnxruntime is not None:
                options.update(self._trt_profiles(onnxruntime, options))
            entries.append((provider, options))
        return entries

    def _trt_profiles(self, onnxruntime: Any, options: Mapping[str, Any]) -> dict[str, str]:
        """Profile options for this graph's inputs (none when given explicitly, or when a dimension is unbounded:
        the EP then builds engines per shape, slower to warm up but correct)."""
        from edgecap.runtime.backends.onnxruntime.gpu import graph_profile_options

        if any(k.startswith("trt_profile_") for k in options):
            return {}
        try:
            return graph_profile_options(
                onnxruntime, self._source, self.trt_profile_dims or {}, self.role, self.trt_opt_batch, self.trt_beam
            )
        except ValueError as exc:
            log.warning("%s: no TensorRT optimisation profiles (%s); engines are built per input shape", self.name, exc)
            return {}

    def _activate(self) -> None:
        onnxruntime = import_onnxruntime()
        options = self._session_options(onnxruntime)
        self.session_settings = read_settings(options)
        entries = self._provider_entries(onnxruntime)
        try:
            self._session, self.provider_fallback = open_session(onnxruntime, self._source, options, entries)
        except Exception as exc:  # ONNX Runtime raises its own exception types (InvalidGraph, Fail, NoSuchFile ...)
            raise RuntimeInputError(f"{self.name}: onnxruntime could not load the model: {exc}") from exc
        in_use = list(self._session.get_providers())
        self._entries_in_use = [(p, o) for p, o in entries if p in in_use]
        self._follow(in_use, self._session.get_provider_options() if self.provider_fallback else None)
        if self.provider_fallback is not None and self.warn_fallback:
            warnings.warn(
                f"{self.name}: ONNX Runtime is {self.provider_fallback.describe()}", ProviderFallbackWarning, 3
            )
        self._inputs = {
            i.name: TensorMeta(i.name, ONNXRUNTIME_TYPES.get(i.type, i.type), tuple(dim_of(d) for d in i.shape))
            for i in self._session.get_inputs()
        }
        self._output_names = tuple(o.name for o in self._session.get_outputs())
        self._output_list = list(self._output_names)
        self._fast_checks = fast_checks(self._inputs.values())
        self._wide_rule = self._rows_rule()
        # One IOBinding per thread: a binding holds the bound buffers of one run, and a Captioner may be called
        # from several threads at once (ONNX Runtime sessions themselves are thread-safe).
        self._binding = threading.local() if self.io_binding else None
        # The torch side of binding, resolved once here and not per call (edgecap.runtime.torch_hooks).
        self._run_bound = torch_hook("onnxruntime_binding") if self.io_binding else None

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
        onnxruntime, wide = import_onnxruntime(), self.wide
        if wide is None:  # a rows rule exists only with a wide plan
            raise RuntimeError(f"{self.name}: no wide plan")
        options = self._session_options(onnxruntime, wide)
        settings = read_settings(options)
        try:  # on the providers the narrow session runs on: one that did not start is not tried again
            session = onnxruntime.InferenceSession(self._source, options, providers=list(self._entries_in_use))
        except Exception as exc:
            raise RuntimeInputError(f"{self.name}: onnxruntime could not load the model (wide session): {exc}") from exc
        self.session_settings = {**self.session_settings, "wide": settings}
        log.info("%s: wide session (%d threads) for calls from %d rows", self.name, wide.intra_op, rows)
        return session

    def _close(self) -> None:
        self._binding = self._run_bound = None
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
        """The providers the session actually registered (ONNX Runtime drops ones that failed to initialise)."""
        return list(self.session.get_providers())

    def metadata(self) -> dict[str, str]:
        """The graph's ``metadata_props`` (edgecap writes opset, precision, graph role, model name …)."""
        return dict(self.session.get_modelmeta().custom_metadata_map)

    # -- inference ---------------------------------------------------------------------------------------------------
    def check_feed(self, feed: Mapping[str, Array]) -> None:
        """The base class's check with a fast path for the decode loop: numpy arrays of the declared dtype, rank and
        fixed sizes pass with a few comparisons (the generic check costs ~20 µs per input, a visible share of a
        0.3 ms step); anything else goes through the full check and its error messages."""
        if not passes_fast_checks(self._fast_checks, feed):
            super().check_feed(feed)

    def _infer(self, feed: Mapping[str, Array]) -> dict[str, Array]:
        wide = self._wide_or_none(feed) if self._wide_rule is not None else None
        if wide is not None:
            self.wide_inference_count += 1
        if self._binding is not None:
            return self._infer_bound(feed, wide)
        for value in feed.values():
            if type(value) is not np.ndarray:  # e.g. torch tensors (an unchecked feed): convert every input
                feed = {name: as_numpy(v) for name, v in feed.items()}
                break
        outputs = (wide or self._session).run(self._output_list, feed)
        return dict(zip(self._output_names, outputs, strict=True))

    def _infer_bound(self, feed: Mapping[str, Array], wide: Any = None) -> dict[str, Array]:
        session, slot = (wide, "wide") if wide is not None else (self._session, "value")
        binding = getattr(self._binding, slot, None)
        if binding is None:  # one per thread and session
            binding = session.io_binding()
            setattr(self._binding, slot, binding)
        if self._run_bound is None:
            raise RuntimeError(f"{self.name}: io-binding run on a session not activated with io_binding")
        return self._run_bound(session, binding, feed, self._output_names, self.device_type, self.device_id)
