"""Old spellings that still work, with a ``FutureWarning``: renamed module attributes and renamed option values.

"ort" used to name ONNX Runtime in a few public names and option values while it also names the Object Relation
Transformer model family; those names now spell ``onnxruntime``. What users already typed keeps working (warned, as
runtime aliases are in :func:`edgecap.runtime.backends.registry.canonical_runtime`) until the old names are removed.
Standard library only: the runtime install imports this module.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["renamed_getattr", "renamed_value", "warn_renamed"]


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that ``old`` (a name or an option value, as the user wrote it) is now called ``new``."""
    warnings.warn(f"{old} is now called {new}; the old name will be removed", FutureWarning, stacklevel)


def renamed_getattr(
    module: str, renamed: Mapping[str, str], fallback: Callable[[str], Any] | None = None
) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` that resolves an old name in ``renamed`` (old -> new) to the object now under
    its new name, with a ``FutureWarning``; other names go to ``fallback`` (e.g.
    :func:`edgecap.runtime._lazy.lazy_getattr`).
    """

    def __getattr__(name: str) -> Any:
        new = renamed.get(name)
        if new is not None:
            warn_renamed(f"{module}.{name}", f"{module}.{new}")
            return getattr(sys.modules[module], new)
        if fallback is not None:
            return fallback(name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def renamed_value(what: str, value: str, renamed: Mapping[str, str], stacklevel: int = 3) -> str:
    """``value`` of option ``what``, or its new spelling (with a ``FutureWarning``) when it is an old one."""
    new = renamed.get(value)
    if new is None:
        return value
    warn_renamed(f"{what} {value!r}", repr(new), stacklevel + 1)
    return new
