"""Runtime adapters: one :class:`Runtime` interface, backends registered by name and imported only when used.

``RuntimeStepModel`` turns an encoder runtime and a decoder-step runtime into the decoding ``StepModel``, so the
one beam search in ``edgecap.decoding`` runs on every backend.
"""

from __future__ import annotations

import importlib
from typing import Any

from edgecap._lazy import lazy_getattr
from edgecap.runtimes.base import Runtime, RuntimeInputError, RuntimeStateError, TensorMeta, dtype_name

# registry key -> "module:ClassName"; a backend is one module plus one line here (or a register_runtime call).
_RUNTIMES: dict[str, str] = {
    "torch": "edgecap.runtimes.torch:TorchRuntime",
    "ort": "edgecap.runtimes.ort:OrtRuntime",
}

_LAZY: dict[str, str] = {
    "RuntimeStepModel": "edgecap.runtimes.bridge",
    "TorchRuntime": "edgecap.runtimes.torch",
    "TorchStepModel": "edgecap.runtimes.torch",
    "PrefixRerunStepModel": "edgecap.runtimes.prefix",
    "TorchRefineModel": "edgecap.runtimes.refine",
    "RuntimeRefineModel": "edgecap.runtimes.refine",
    "create_ort_refine_model": "edgecap.runtimes.refine",
}


class UnknownRuntimeError(ValueError):
    """A runtime name that is not registered, or whose backend cannot be imported."""


def register_runtime(name: str, target: str) -> None:
    """Register ``target`` (``"package.module:ClassName"``) under ``name``; re-registering a name replaces it."""
    if ":" not in target:
        raise ValueError(f"runtime target must look like 'package.module:ClassName', got {target!r}")
    _RUNTIMES[name] = target


def list_runtimes() -> list[str]:
    """Registered runtime names (available or not on this machine)."""
    return sorted(_RUNTIMES)


def get_runtime_class(name: str) -> type[Runtime]:
    """Import and return the runtime class registered as ``name``."""
    target = _RUNTIMES.get(name)
    if target is None:
        raise UnknownRuntimeError(f"unknown runtime {name!r}; registered: {list_runtimes()}")
    module_name, attr = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == module_name:
            raise UnknownRuntimeError(
                f"runtime {name!r} is registered but {module_name} is not part of this installation"
            ) from exc
        raise UnknownRuntimeError(
            f"runtime {name!r} is not available: importing {module_name} failed ({exc}). "
            f"Install its backend (e.g. pip install 'edgecap[onnx]' for 'ort')."
        ) from exc
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Runtime)):
        raise UnknownRuntimeError(f"runtime {name!r}: {target} is not a Runtime subclass")
    return cls


def load_runtime(name: str, *args: Any, **kwargs: Any) -> Runtime:
    """Construct the runtime registered as ``name`` (not yet activated: use it as a context manager)."""
    return get_runtime_class(name)(*args, **kwargs)


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "PrefixRerunStepModel",
    "Runtime",
    "RuntimeInputError",
    "RuntimeStateError",
    "RuntimeRefineModel",
    "RuntimeStepModel",
    "TensorMeta",
    "TorchRefineModel",
    "TorchRuntime",
    "TorchStepModel",
    "UnknownRuntimeError",
    "create_ort_refine_model",
    "dtype_name",
    "get_runtime_class",
    "list_runtimes",
    "load_runtime",
    "register_runtime",
]
