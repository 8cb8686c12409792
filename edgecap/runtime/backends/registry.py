"""The one runtime registry: ``Captioner.load``, ``edgecap caption`` and ``edgecap bench`` find runtimes here.

A runtime is one module plus one :func:`register_runtime` call. Its :class:`RuntimeSpec` names, as import strings so
nothing heavy is imported until the runtime is used:

- ``loader``: a :class:`RuntimeLoader`, ``(Bundle, LoadRequest) -> LoadedRuntime``, everything a
  :class:`~edgecap.Captioner` needs to caption with the bundle on this runtime (step model, image preprocessing,
  what was chosen and why);
- ``graph_runtime``: the :class:`~edgecap.runtime.backends.base.Runtime` that runs one graph (tests, parity, tools);
- ``requires``: the modules it imports, checked with ``importlib.util.find_spec`` (no import) to tell whether the
  runtime is usable here, and ``install``: what to install when it is not.

The built-in ONNX Runtime and TensorRT runtimes register in :mod:`edgecap.runtime.backends`. The torch runtimes
(``torch``, ``torch-rerun``) are the workshop half's and register as a plugin, like a third-party runtime: through the
``edgecap.runtimes`` entry-point group (:mod:`edgecap.runtime.plugins`), loaded the first time the registry is
queried.

This module imports nothing beyond the standard library.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from edgecap.runtime.plugins import RUNTIME_GROUP, PluginLoader, claim_names

if TYPE_CHECKING:  # annotations only: the registry imports nothing beyond the standard library
    from edgecap.runtime.bundle import Bundle
    from edgecap.runtime.decoding.mask_predict import RefineModel
    from edgecap.runtime.decoding.protocol import StepModel
    from edgecap.runtime.images.inputs import ImageInputs

__all__ = [
    "CaptionerError",
    "LoadRequest",
    "LoadedRuntime",
    "STEP_MODES",
    "RuntimeLoader",
    "RuntimeSpec",
    "UnknownRuntimeError",
    "auto_runtime",
    "canonical_runtime",
    "get_runtime",
    "list_runtimes",
    "load_runtime_plugins",
    "register_runtime",
    "runtime_available",
]


class UnknownRuntimeError(ValueError):
    """A runtime name that is not registered, or whose backend cannot be imported."""


class CaptionerError(ValueError):
    """A runtime/precision request a bundle or this machine cannot serve, or inputs a captioner cannot take
    (raised by the runtimes' loaders and by :class:`~edgecap.Captioner`)."""


#: The decoder-step modes a runtime can offer (``RuntimeSpec.step_modes``): ``eager`` (the model's own step, growing
#: caches), ``static`` (static-shape caches written in place, any device), ``cuda-graph`` (the static step captured
#: in a CUDA graph per capacity and replayed), ``compile`` (the static step through ``torch.compile``; on CUDA also
#: captured); ``auto`` picks among a runtime's modes.
STEP_MODES: tuple[str, ...] = ("eager", "static", "cuda-graph", "compile")


@dataclass(frozen=True)
class RuntimeSpec:
    """A registered runtime.

    Attributes:
        name: the key users type (``runtime="onnxruntime"``, ``--runtime onnxruntime``).
        description: one line for help texts and reports.
        loader: ``"package.module:function"`` of its :class:`RuntimeLoader`, called as ``loader(bundle, request)``.
        graph_runtime: ``"package.module:Class"`` of its one-graph :class:`~edgecap.runtime.backends.base.Runtime`, if
        any.
        requires: top-level modules it needs (``("onnxruntime",)``).
        install: how to get them, for error messages.
        precisions: bundle precisions it can run at all.
        auto_rank: ``runtime="auto"`` takes the available runtime with the lowest rank; None: only by name.
        baseline: a comparison baseline for benchmarks (e.g. re-running the prefix), not a deployment runtime.
        torch: it runs the bundle's torch weights (``weights.safetensors``) in torch: ``edgecap bench`` then applies
            torch's device rules (FP16 only on CUDA) and runs a mask-predict bundle at FP32 only.
        aliases: older names still accepted (with a ``FutureWarning``) where users type a runtime, and read from
            reports written before a rename.
        step_modes: how it can run a decoder step (``step_mode=`` of ``Captioner.load``, ``edgecap bench
            --step-mode``); every runtime runs ``"eager"``.
    """

    name: str
    description: str
    loader: str
    graph_runtime: str | None = None
    requires: tuple[str, ...] = ()
    install: str = ""
    precisions: tuple[str, ...] = ("fp32",)
    auto_rank: int | None = None
    baseline: bool = False
    torch: bool = False
    aliases: tuple[str, ...] = ()
    step_modes: tuple[str, ...] = ("eager",)

    def __post_init__(self) -> None:
        for label, target in (("loader", self.loader), ("graph_runtime", self.graph_runtime)):
            if target is not None and (":" not in target or target.startswith(":") or target.endswith(":")):
                raise ValueError(f"runtime {self.name!r}: {label} must look like 'package.module:attr', got {target!r}")

    def available(self) -> tuple[bool, str]:
        """(usable here, why not) from the ``requires`` modules, without importing them."""
        missing = [m for m in self.requires if _find_spec(m) is None]
        if missing:
            hint = f": {self.install}" if self.install else ""
            return False, f"runtime {self.name!r} needs {', '.join(missing)}, which is not installed{hint}"
        return True, ""

    def load_function(self) -> RuntimeLoader:
        """The imported loader; a clear :class:`UnknownRuntimeError` when its backend is missing."""
        loader: RuntimeLoader = _import(self, self.loader)
        return loader

    def graph_runtime_class(self) -> type:
        """The imported one-graph runtime class."""
        if self.graph_runtime is None:
            raise UnknownRuntimeError(f"runtime {self.name!r} has no one-graph Runtime class")
        return _import(self, self.graph_runtime)


@dataclass(frozen=True)
class LoadRequest:
    """What the caller of ``Captioner.load`` asked for; a loader resolves ``"auto"`` values and says why.

    Attributes:
        precision: ``"auto"``, ``"fp32"``, ``"fp16"`` or ``"int8"``.
        threads: ONNX Runtime sessions' threading: ``"auto"`` (None means the same), ``"dedicated"``, or an
            intra-op count (0 = ONNX Runtime's own default); :func:`edgecap.runtime.backends.threads.plan_threads`.
            Never
            process-wide.
        spin: force ONNX Runtime's pool threads to spin (True) or not (False); None = the thread policy's choice.
        streams: decodes that run at once in this process (the thread policy shares cores among them).
        providers: execution providers in priority order (runtimes that have them), None = the best present.
        device: a device string for runtimes that take one (``"cuda:0"``), None = the best present.
        verify: hash the files the runtime reads (:meth:`edgecap.runtime.bundle.Bundle.verify`) before using them.
        beam: the beam width the search will decode with (None: the bundle's); runtimes whose compiled engines
            fix the rows per image (``tensorrt``) choose and check their engines by it.
        step_mode: how the torch runtime runs a decoder step (``"eager"``, ``"static"``, ``"cuda-graph"``,
            ``"compile"``, ``"auto"``; :mod:`edgecap.workshop.torch_runtime.static_cache`); other runtimes take only
            ``"eager"``.
        trt_opt_batch: images per call ONNX Runtime's TensorRT provider tunes its optimisation profiles for (the step
            graph's rows: this times ``beam``); None =
            ``edgecap.runtime.backends.onnxruntime.gpu.DEFAULT_TRT_OPT_BATCH``.
            The profiles' maximum stays the bundle's limit.
        trt_workspace_mb: the TensorRT provider's workspace limit in MiB; None =
            ``edgecap.runtime.backends.onnxruntime.gpu.DEFAULT_TRT_WORKSPACE_MB`` (sized for a Jetson), 0 = no limit of
            edgecap's (the provider's own).
    """

    precision: str = "auto"
    threads: int | str | None = None
    spin: bool | None = None
    streams: int = 1
    providers: Sequence[str] | str | None = None
    device: str | None = None
    verify: bool = True
    step_mode: str = "eager"
    beam: int | None = None
    trt_opt_batch: int | None = None
    trt_workspace_mb: int | None = None


@dataclass
class LoadedRuntime:
    """What a loader returns: the decoding adapter, how images become its inputs, and what was chosen.

    Attributes:
        step_model: a :class:`~edgecap.runtime.decoding.StepModel` (or ``RefineModel`` for mask-predict bundles).
        inputs: images -> encoder inputs (numpy arrays), or None when the bundle takes precomputed features only.
        info: ``precision``, ``precision_reason``, ``device``, ``providers``, ``backbone`` … (``runtime_info``).
        resources: context managers closed by ``Captioner.close`` (sessions), already entered.
        no_images_reason: why ``inputs`` is None.
    """

    step_model: StepModel | RefineModel
    inputs: ImageInputs | None
    info: dict[str, Any] = field(default_factory=dict)
    resources: list[Any] = field(default_factory=list)
    no_images_reason: str = ""


class RuntimeLoader(Protocol):
    """A runtime's entry point (:attr:`RuntimeSpec.loader`): an opened bundle and what the caller asked for ->
    everything a :class:`~edgecap.Captioner` needs to caption with it on this runtime.

    A loader resolves the request's ``"auto"`` values (precision, providers, device) and says why in
    ``LoadedRuntime.info``; it raises :class:`CaptionerError` for a request the bundle or this machine cannot serve.
    """

    def __call__(self, bundle: Bundle, request: LoadRequest, /) -> LoadedRuntime: ...


_REGISTRY: dict[str, RuntimeSpec] = {}
_ALIASES: dict[str, str] = {}
#: Runtime name or alias -> the plugin that registered it (names absent here are edgecap's own).
_PLUGIN_NAMES: dict[str, str] = {}


def register_runtime(spec: RuntimeSpec) -> RuntimeSpec:
    """Register (or replace) a runtime; returns ``spec``.

    Raises:
        edgecap.runtime.plugins.PluginError: called while an entry-point plugin loads, with a name or alias already
            registered (a plugin never silently replaces a built-in).
    """
    if not isinstance(spec, RuntimeSpec):
        raise TypeError(f"register_runtime takes a RuntimeSpec, got {type(spec).__name__}")
    claim_names("runtime", (spec.name, *spec.aliases), _registered_as, _PLUGIN_NAMES)
    taken = [a for a in (spec.name, *spec.aliases) if _ALIASES.get(a, spec.name) != spec.name]
    taken += [a for a in spec.aliases if a in _REGISTRY]
    if taken:
        raise ValueError(f"runtime {spec.name!r}: name(s) {taken} already belong to another runtime")
    _REGISTRY[spec.name] = spec
    _ALIASES.update(dict.fromkeys(spec.aliases, spec.name))
    return spec


def _registered_as(name: str) -> str | None:
    """The registered runtime ``name`` is taken by (itself, or the runtime it is an alias of), None when free."""
    return _ALIASES.get(name, name) if name in _REGISTRY or name in _ALIASES else None


_PLUGINS = PluginLoader(RUNTIME_GROUP, RuntimeSpec, register_runtime)
#: Why the torch runtimes are absent when edgecap's own entry points are (its metadata predates them, or a source tree
#: is used without ``pip install -e .``).
_NO_OWN_PLUGINS = (
    "the torch runtimes of the training stack are not registered: edgecap's installed metadata lacks its entry "
    "points (reinstall it: pip install 'edgecap[train]', or pip install -e '.[train]' in a source checkout)"
)


def load_runtime_plugins() -> None:
    """Register the runtimes of installed plugins (the ``edgecap.runtimes`` entry points), once; every query of
    the registry calls this, so a plugin is there without any import in the user's code.

    Raises:
        edgecap.runtime.plugins.PluginError: a plugin's runtime name clashes with one already registered.
    """
    _PLUGINS.ensure_loaded()


def canonical_runtime(name: str, *, warn: bool = False) -> str:
    """The registered name of ``name`` (itself, or the runtime it is an older alias of); unknown names unchanged.

    Args:
        warn: emit a ``FutureWarning`` for an alias (where a user typed it, not when reading an old report).
    """
    load_runtime_plugins()
    if name in _REGISTRY or name not in _ALIASES:
        return name
    current = _ALIASES[name]
    if warn:
        warnings.warn(f"runtime {name!r} is now called {current!r}; the old name will be removed", FutureWarning, 3)
    return current


def get_runtime(name: str) -> RuntimeSpec:
    """The spec registered as ``name`` (an older alias works, with a ``FutureWarning``)."""
    load_runtime_plugins()
    spec = _REGISTRY.get(canonical_runtime(name, warn=True))
    if spec is None:
        missing = "" if _PLUGINS.own_found else f"; {_NO_OWN_PLUGINS}"
        raise UnknownRuntimeError(f"unknown runtime {name!r}; registered: {list_runtimes()}{missing}")
    return spec


def list_runtimes(*, available: bool = False, baselines: bool = True) -> list[str]:
    """Registered runtime names, in ``auto`` order first then by name.

    Args:
        available: only those whose backend is installed here.
        baselines: include benchmark baselines (``torch-rerun``).
    """
    load_runtime_plugins()
    specs = [s for s in _REGISTRY.values() if baselines or not s.baseline]
    if available:
        specs = [s for s in specs if s.available()[0]]
    return [s.name for s in sorted(specs, key=lambda s: (s.auto_rank is None, s.auto_rank or 0, s.name))]


def runtime_available(name: str) -> tuple[bool, str]:
    """(usable here, why not) for a registered runtime."""
    return get_runtime(name).available()


def auto_runtime() -> tuple[RuntimeSpec, str]:
    """The runtime ``runtime="auto"`` picks — the lowest ``auto_rank`` whose backend is installed — and why.

    Raises:
        UnknownRuntimeError: none is installed; the message says what to install.
    """
    load_runtime_plugins()
    ranked = sorted((s for s in _REGISTRY.values() if s.auto_rank is not None), key=lambda s: s.auto_rank or 0)
    skipped: list[str] = []
    for spec in ranked:
        ok, why = spec.available()
        if ok:
            reason = f"{spec.name}: the first installed of {[s.name for s in ranked]}"
            if skipped:
                reason += f" ({'; '.join(skipped)})"
            return spec, reason
        skipped.append(why)
    raise UnknownRuntimeError(
        "no runtime is installed: " + "; ".join(skipped) if skipped else "no runtime is registered"
    )


def _find_spec(module: str) -> Any:
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a broken parent package, or a module set to None in sys.modules
        return None


def _import(spec: RuntimeSpec, target: str) -> Any:
    module_name, attr = target.split(":")
    ok, why = spec.available()
    if not ok:
        raise UnknownRuntimeError(why)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == module_name:
            raise UnknownRuntimeError(
                f"runtime {spec.name!r} is registered but {module_name} is not part of this installation"
            ) from exc
        hint = f" {spec.install}" if spec.install else ""
        raise UnknownRuntimeError(
            f"runtime {spec.name!r} is not available: importing {module_name} failed ({exc}).{hint}"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UnknownRuntimeError(f"runtime {spec.name!r}: {module_name} has no {attr!r}") from None
