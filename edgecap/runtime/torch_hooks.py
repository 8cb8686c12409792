"""Where the runtime half reaches torch: four named hooks, resolved by import string when a torch path is asked for.

The runtime package imports numpy, Pillow and an inference engine only, at module level and inside functions. Four
features still need torch when a user asks for them, and their code lives in :mod:`edgecap.workshop.torch_runtime`
(the ``[train]`` extra):

- ``torch_arrays``: a decode state kept in torch tensors (ONNX Runtime's io-binding path on CUDA, where the caches
  stay on the GPU and the beam gather is a device ``index_select``);
- ``onnxruntime_binding``: one ``run_with_iobinding`` call with torch tensors bound by device pointer;
- ``backbone_inputs``: a bundle whose encoder takes backbone features runs its backbone in torch;
- ``captioner_from_run``: :meth:`edgecap.Captioner.from_run` decodes a training run's torch weights.

The hooks are named here as ``"module:attribute"`` strings, as the runtime registry names its loaders, so no import
statement of the runtime package reaches the workshop half (``tests/test_import_graph.py`` walks them all, and checks
that this table is the only place naming ``edgecap.workshop``).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__all__ = ["HOOKS", "TorchUnavailableError", "torch_available", "torch_hook"]

#: Hook name -> ``"module:attribute"`` in the workshop half.
HOOKS: dict[str, str] = {
    "torch_arrays": "edgecap.workshop.torch_runtime.arrays:TORCH_OPS",
    "onnxruntime_binding": "edgecap.workshop.torch_runtime.onnxruntime_binding:run_bound",
    "backbone_inputs": "edgecap.workshop.torch_runtime.images:backbone_inputs",
    "captioner_from_run": "edgecap.workshop.torch_runtime.run_captioner:captioner_from_run",
}

#: What to install for a hook when torch is missing.
INSTALL = "pip install 'edgecap[train]'"


class TorchUnavailableError(ImportError):
    """A torch path was asked for on an install without torch (the runtime-only install)."""


def torch_available() -> bool:
    """Whether torch is importable here (checked without importing it)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules
        return False


def torch_hook(name: str) -> Any:
    """The workshop-half object behind hook ``name`` (imported on first use).

    Raises:
        KeyError: an unknown hook name.
        TorchUnavailableError: torch is not installed, or the workshop half is not part of this installation.
    """
    module_name, _, attribute = HOOKS[name].partition(":")
    if not torch_available():
        raise TorchUnavailableError(f"{name} runs in torch, which is not installed here: {INSTALL}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TorchUnavailableError(f"{name} needs {module_name}, which failed to import ({exc}): {INSTALL}") from exc
    return getattr(module, attribute)
