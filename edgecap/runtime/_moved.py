"""Module paths from before the split into ``edgecap.runtime`` and ``edgecap.workshop`` keep importing, with a warning.

``import edgecap.runtimes.onnxruntime_session`` (an old path) imports ``edgecap.runtime.backends.onnxruntime.session``
and registers that same module object under the old name too, so ``from OLD import NAME`` and ``import OLD as x``
keep working in code written before the move. Each old name warns once (a ``FutureWarning`` naming the new path)
when it is first imported. Submodules of a moved package map by their longest moved prefix
(``edgecap.models.backbone`` -> ``edgecap.workshop.models.backbone``). Nothing exists at the old paths on disk: the
finder (installed by ``import edgecap``) answers for them. Standard library only, and the workshop half is imported
only when an old build-side path is: a device install never imports torch through it. ``docs/migration.md`` lists
:data:`MOVED` (``tests/runtime/test_moved.py`` keeps the two equal).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "MovedModuleFinder", "install", "new_module_name"]

#: Old module path -> new module path; a package's entry covers its whole subtree.
MOVED: dict[str, str] = {
    "edgecap.bundle.exporting": "edgecap.workshop.export.bundling",
    "edgecap.bundle.export": "edgecap.workshop.export.bundle",
    "edgecap.bundle.writer": "edgecap.workshop.export.writer",
    "edgecap.bundle.report": "edgecap.workshop.export.report",
    "edgecap.bundle": "edgecap.runtime.bundle",
    "edgecap.export": "edgecap.workshop.export",
    "edgecap.calibration": "edgecap.workshop.export.calibration",
    "edgecap.models": "edgecap.workshop.models",
    "edgecap.training": "edgecap.workshop.training",
    "edgecap.evaluation": "edgecap.workshop.evaluation",
    "edgecap.interop": "edgecap.workshop.interop",
    "edgecap.data.images": "edgecap.runtime.images.load",
    "edgecap.data.preprocess": "edgecap.runtime.images.preprocess",
    "edgecap.data.vocab": "edgecap.runtime.vocab",
    "edgecap.data.text": "edgecap.runtime.text",
    "edgecap.data": "edgecap.workshop.data",
    "edgecap.decoding": "edgecap.runtime.decoding",
    "edgecap.engines": "edgecap.runtime.engines",
    "edgecap.runtimes.images": "edgecap.runtime.images.inputs",
    "edgecap.runtimes.onnxruntime_providers": "edgecap.runtime.backends.onnxruntime.providers",
    "edgecap.runtimes.onnxruntime_fallback": "edgecap.runtime.backends.onnxruntime.fallback",
    "edgecap.runtimes.onnxruntime_bundle": "edgecap.runtime.backends.onnxruntime.loader",
    "edgecap.runtimes.onnxruntime_session": "edgecap.runtime.backends.onnxruntime.session",
    "edgecap.runtimes.onnxruntime_step": "edgecap.runtime.backends.onnxruntime.step",
    "edgecap.runtimes.onnxruntime_arrays": "edgecap.runtime.backends.onnxruntime.arrays",
    "edgecap.runtimes.onnxruntime_gpu": "edgecap.runtime.backends.onnxruntime.gpu",
    "edgecap.runtimes.decoders": "edgecap.runtime.backends.onnxruntime.decoders",
    "edgecap.runtimes.tensorrt_engines": "edgecap.runtime.backends.tensorrt.engines",
    "edgecap.runtimes.tensorrt": "edgecap.runtime.backends.tensorrt.runtime",
    "edgecap.runtimes.torch": "edgecap.workshop.torch_runtime.runtime",
    "edgecap.runtimes.prefix": "edgecap.workshop.torch_runtime.prefix",
    "edgecap.runtimes.static_cache": "edgecap.workshop.torch_runtime.static_cache",
    "edgecap.runtimes": "edgecap.runtime.backends",
    "edgecap.captioner": "edgecap.runtime.captioner",
    "edgecap.captioning": "edgecap.runtime.captioning",
    "edgecap.length": "edgecap.runtime.length",
    "edgecap.precisions": "edgecap.runtime.precisions",
    "edgecap.plugins": "edgecap.runtime.plugins",
    "edgecap._home": "edgecap.runtime._home",
    "edgecap._io": "edgecap.runtime._io",
    "edgecap._versions": "edgecap.runtime._versions",
    "edgecap._process": "edgecap.runtime._process",
    "edgecap._lazy": "edgecap.runtime._lazy",
    "edgecap._renamed": "edgecap.runtime._renamed",
    "edgecap._progress": "edgecap.workshop._progress",
    "edgecap.runs": "edgecap.workshop.runs",
    "edgecap.quickstart": "edgecap.workshop.quickstart",
}

#: Longest old path first, so ``edgecap.bundle.export`` wins over ``edgecap.bundle``.
_BY_LENGTH = sorted(MOVED.items(), key=lambda item: -len(item[0]))


def new_module_name(old: str) -> str | None:
    """The module now at old path ``old`` (its longest moved prefix replaced), or None when ``old`` did not move."""
    if not old.startswith("edgecap."):
        return None
    for prefix, new in _BY_LENGTH:
        if old == prefix or old.startswith(prefix + "."):
            return new + old[len(prefix) :]
    return None


class _ParentGuard:
    """Stands in ``sys.modules`` for an old parent while its child loads, to drop the import system's
    ``setattr(parent, child, module)`` where the new parent already holds another module under the old child's name
    (``edgecap.runtimes.tensorrt`` is ``backends.tensorrt.runtime``, while ``backends.tensorrt`` is the package)."""

    def __init__(self, name: str, module: ModuleType) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", module)

    def __getattr__(self, attr: str) -> Any:
        return getattr(object.__getattribute__(self, "_module"), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        sys.modules[object.__getattribute__(self, "_name")] = object.__getattribute__(self, "_module")


class _AliasLoader(importlib.abc.Loader):
    """Loads old path ``old`` as the module at its new path ``new`` (imported, not copied)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new
        self._own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        # stacklevel 2: the import statement's frame (warnings skips importlib's own frames)
        warnings.warn(f"{self.old} moved to {self.new}; the old path will be removed", FutureWarning, stacklevel=2)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # module_from_spec set __spec__ to the alias spec: the module keeps its own (reload, pickling, inspect)
        module.__spec__ = self._own_spec
        parent, _, child = self.old.rpartition(".")
        parent_module = sys.modules.get(parent)
        if isinstance(parent_module, ModuleType) and vars(parent_module).get(child, module) is not module:
            sys.modules[parent] = _ParentGuard(parent, parent_module)  # type: ignore[assignment]


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers for the old module paths in :data:`MOVED`, and for nothing else."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_module_name(fullname)
        return None if new is None else importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname, new))


def install() -> MovedModuleFinder:
    """Put the finder first on ``sys.meta_path`` (once): the old parents are the new packages, whose own paths may
    hold a different module under an old child name."""
    for finder in sys.meta_path:
        if isinstance(finder, MovedModuleFinder):
            return finder
    finder = MovedModuleFinder()
    sys.meta_path.insert(0, finder)
    return finder
