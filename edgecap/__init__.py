"""edgecap: train, export and run compact image captioners on edge devices.

Heavy submodules (torch models, onnxruntime, TensorRT) are imported lazily so that
``import edgecap`` stays cheap and works without optional backends.
"""

from __future__ import annotations

from edgecap._lazy import lazy_getattr
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


__getattr__ = lazy_getattr(__name__, _LAZY)
