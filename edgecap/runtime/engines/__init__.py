"""TensorRT engines from bundles: profiles, build settings, the engine cache in the bundle, device buffers.

- ``graphs``: a bundle graph's inputs/outputs with their dynamic-axis names (onnx or onnxruntime, no torch);
- ``profiles``: optimisation-profile shapes from the bundle's dynamic axes (rows = batch × beam, cache length,
  regions, LaBERT's caption length);
- ``settings``: precision -> strongly/weakly typed network and builder flags, per TensorRT version (10.3 to 11);
- ``store``: the cache key (TensorRT version, GPU, compute capability, precision, profile, graph checksums), the
  ``engines/<key>/`` folder and when an engine may be loaded;
- ``buffers``: the device buffers of one batch shape;
- ``cuda``: device memory, copies and streams through cuda-python;
- ``build``: :func:`build_engines` (``edgecap engine``); ``tensorrt_api``: every TensorRT call of a build (the only
  module that imports tensorrt to build).

The runtime that runs the engines is ``edgecap.runtime.backends.tensorrt.runtime`` (``Captioner.load(bundle,
runtime="tensorrt")``).
Only the standard library and numpy are imported here; tensorrt and cuda-python are imported when an engine is
built or run. See ``docs/tensorrt.md``.
"""

from __future__ import annotations

from edgecap.runtime._lazy import lazy_dir, lazy_getattr

_LAZY: dict[str, str] = {
    "build_engines": "edgecap.runtime.engines.build",
    "EngineBuildError": "edgecap.runtime.engines.build",
    "EngineUnavailableError": "edgecap.runtime.engines.build",
    "BufferPlan": "edgecap.runtime.engines.buffers",
    "plan_buffers": "edgecap.runtime.engines.buffers",
    "read_graph_io": "edgecap.runtime.engines.graphs",
    "EngineProfile": "edgecap.runtime.engines.profiles",
    "ProfileRequest": "edgecap.runtime.engines.profiles",
    "graph_profile": "edgecap.runtime.engines.profiles",
    "BuildSettings": "edgecap.runtime.engines.settings",
    "build_settings": "edgecap.runtime.engines.settings",
    "EngineEnv": "edgecap.runtime.engines.store",
    "EngineMismatchError": "edgecap.runtime.engines.store",
    "find_engines": "edgecap.runtime.engines.store",
    "fitting_engines": "edgecap.runtime.engines.store",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
__dir__ = lazy_dir(globals(), _LAZY)
