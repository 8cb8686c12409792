"""edgecap: train, export and run compact image captioners on edge devices.

Heavy submodules (torch models, onnxruntime, TensorRT) are imported lazily so that
``import edgecap`` stays cheap and works without optional backends.
"""

from __future__ import annotations

from edgecap._version import __version__
from edgecap.runtime._lazy import lazy_dir, lazy_getattr

_LAZY: dict[str, str] = {
    "create_model": "edgecap.workshop.models",
    "list_models": "edgecap.workshop.models",
    "create_backbone": "edgecap.workshop.models.backbone",
    "load_vocab": "edgecap.runtime.vocab",
    "build_vocab": "edgecap.runtime.vocab",
    "load_runtime": "edgecap.runtime.backends",
    "Captioner": "edgecap.runtime.captioner",
}

__all__ = ["__version__", *_LAZY]


__getattr__ = lazy_getattr(__name__, _LAZY)
__dir__ = lazy_dir(globals(), _LAZY)
