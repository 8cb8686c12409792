"""Where the runtime half reaches torch: four named hooks, which the workshop half registers as a plugin.

The runtime package imports numpy, Pillow and an inference engine only, at module level and inside functions. Four
features still need torch when a user asks for them (:data:`HOOK_NAMES`):

- ``torch_arrays``: a decode state kept in torch tensors (ONNX Runtime's io-binding path on CUDA, where the caches
  stay on the GPU and the beam gather is a device ``index_select``);
- ``onnxruntime_binding``: one ``run_with_iobinding`` call with torch tensors bound by device pointer;
- ``backbone_inputs``: a bundle whose encoder takes backbone features runs its backbone in torch;
- ``captioner_from_run``: :meth:`edgecap.Captioner.from_run` decodes a training run's torch weights.

Their code is the workshop half's (the ``[train]`` extra). It registers one :class:`TorchHook` per name through the
``edgecap.torch_hooks`` entry points (:mod:`edgecap.runtime.plugins`), read the first time a hook is asked for, so the
runtime never names a workshop module, in an import or a string (``tests/test_import_graph.py`` checks both).

Standard library only.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, overload

from edgecap.runtime.plugins import TORCH_HOOK_GROUP, PluginLoader, claim_names

if TYPE_CHECKING:
    from edgecap.runtime.backends.base import Array
    from edgecap.runtime.backends.bridge import ArrayOps
    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.images.inputs import ImageInputs

__all__ = [
    "HOOK_NAMES",
    "INSTALL",
    "TorchHook",
    "TorchUnavailableError",
    "load_torch_hooks",
    "register_torch_hook",
    "registered_torch_hooks",
    "torch_available",
    "torch_hook",
]

#: The hooks the runtime asks for; a registration of any other name is refused.
HOOK_NAMES: tuple[str, ...] = ("torch_arrays", "onnxruntime_binding", "backbone_inputs", "captioner_from_run")

#: What to install for a hook when torch, or the training stack's registration, is missing.
INSTALL = "pip install 'edgecap[train]'"


#: ``backbone_inputs(spec, weights, device)``: a bundle's backbone spec, its weights file and a torch device -> the
#: torch backbone as images -> encoder inputs.
BackboneInputsHook = Callable[[Mapping[str, object], object, object], "ImageInputs"]
#: ``run_bound(session, binding, feed, output_names, device_type, device_id)``: one ONNX Runtime ``run_with_iobinding``
#: call with torch tensors bound by device pointer -> the outputs by name.
RunBoundHook = Callable[[object, object, Mapping[str, "Array"], Sequence[str], str, int], dict[str, "Array"]]


class CaptionerFromRunHook(Protocol):
    """``captioner_from_run(cls, run, device=..., beam=..., backbone_weights=...)``: a training run's torch weights
    as a ``cls`` (:meth:`edgecap.Captioner.from_run`)."""

    def __call__(
        self,
        cls: type[Captioner],
        run: str | Path,
        device: str = ...,
        beam: int | None = ...,
        backbone_weights: str | Path | None = ...,
    ) -> Captioner: ...


class TorchUnavailableError(ImportError):
    """A torch path was asked for on an install without torch (the runtime-only install), or without the training
    stack's hooks registered."""


@dataclass(frozen=True)
class TorchHook:
    """One registered hook.

    Attributes:
        name: one of :data:`HOOK_NAMES`.
        target: ``"package.module:attribute"`` of the object, imported the first time the hook is asked for (so
            registering it imports no torch).
    """

    name: str
    target: str

    def __post_init__(self) -> None:
        if self.name not in HOOK_NAMES:
            raise ValueError(f"unknown torch hook {self.name!r}; the runtime asks for {list(HOOK_NAMES)}")
        module, _, attribute = self.target.partition(":")
        if not module or not attribute:
            raise ValueError(
                f"torch hook {self.name!r}: target must look like 'package.module:attr', got {self.target!r}"
            )


_HOOKS: dict[str, TorchHook] = {}
#: Hook name -> the third-party plugin that registered it (edgecap's own are absent).
_PLUGIN_NAMES: dict[str, str] = {}


def register_torch_hook(hook: TorchHook) -> TorchHook:
    """Register (or, outside plugin loading, replace) a hook; returns ``hook``.

    Raises:
        edgecap.runtime.plugins.PluginError: called while a third-party plugin loads, for a name already registered.
    """
    if not isinstance(hook, TorchHook):
        raise TypeError(f"register_torch_hook takes a TorchHook, got {type(hook).__name__}")
    claim_names("torch hook", (hook.name,), lambda name: name if name in _HOOKS else None, _PLUGIN_NAMES)
    _HOOKS[hook.name] = hook
    return hook


_PLUGINS = PluginLoader(TORCH_HOOK_GROUP, TorchHook, register_torch_hook)


def load_torch_hooks() -> None:
    """Register the hooks of installed plugins (the ``edgecap.torch_hooks`` entry points), once."""
    _PLUGINS.ensure_loaded()


def registered_torch_hooks() -> dict[str, TorchHook]:
    """The hooks registered here, by name (the plugins loaded first)."""
    load_torch_hooks()
    return dict(_HOOKS)


def torch_available() -> bool:
    """Whether torch is importable here (checked without importing it)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules
        return False


@overload
def torch_hook(name: Literal["torch_arrays"]) -> ArrayOps: ...
@overload
def torch_hook(name: Literal["onnxruntime_binding"]) -> RunBoundHook: ...
@overload
def torch_hook(name: Literal["backbone_inputs"]) -> BackboneInputsHook: ...
@overload
def torch_hook(name: Literal["captioner_from_run"]) -> CaptionerFromRunHook: ...
@overload
def torch_hook(name: str) -> object: ...
def torch_hook(name: str) -> object:
    """The object behind hook ``name`` (its module imported on first use).

    Raises:
        KeyError: not one of :data:`HOOK_NAMES`.
        TorchUnavailableError: torch is not installed; no plugin registered the hook (the training stack's entry
            points are not installed); or its module failed to import.
    """
    if name not in HOOK_NAMES:
        raise KeyError(f"unknown torch hook {name!r}; known: {list(HOOK_NAMES)}")
    if not torch_available():
        raise TorchUnavailableError(f"{name} runs in torch, which is not installed here: {INSTALL}")
    hook = registered_torch_hooks().get(name)
    if hook is None:
        where = "" if _PLUGINS.own_found else " (edgecap's installed metadata lacks its entry points: reinstall it)"
        raise TorchUnavailableError(
            f"{name} needs the training stack, whose torch hooks are not registered here{where}: {INSTALL}"
        )
    module_name, _, attribute = hook.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TorchUnavailableError(f"{name} needs {module_name}, which failed to import ({exc}): {INSTALL}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise TorchUnavailableError(f"torch hook {name!r}: {module_name} has no {attribute!r}") from None
