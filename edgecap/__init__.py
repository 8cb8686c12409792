"""edgecap: train, export and run compact image captioners on edge devices.

Heavy submodules (torch models, onnxruntime, TensorRT) are imported lazily so that
``import edgecap`` stays cheap and works without optional backends.
"""

from __future__ import annotations

import importlib
from typing import Any

from edgecap._version import __version__

_LAZY: dict[str, str] = {
    "create_model": "edgecap.models",
    "list_models": "edgecap.models",
    "create_backbone": "edgecap.models.backbone",
    "load_vocab": "edgecap.data.vocab",
    "build_vocab": "edgecap.data.vocab",
    "load_runtime": "edgecap.runtimes",
    "Captioner": "edgecap.captioner",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgecap' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
