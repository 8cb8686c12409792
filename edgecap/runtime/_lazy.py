"""Lazy package attributes: heavy submodules are imported on first access, never at package import, and the
attributes still show in ``dir()`` (tab completion, ``help()``) before they are loaded."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, targets: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` resolving ``name`` from the module ``targets[name]`` when first used."""

    def __getattr__(name: str) -> Any:
        module = targets.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__


def lazy_dir(module_globals: Mapping[str, Any], targets: Mapping[str, str]) -> Callable[[], list[str]]:
    """A module-level ``__dir__`` listing the module's own names and its lazy attributes."""

    def __dir__() -> list[str]:
        return sorted(set(module_globals) | set(targets))

    return __dir__
