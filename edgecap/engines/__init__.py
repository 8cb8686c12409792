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

The runtime that runs the engines is ``edgecap.runtimes.tensorrt`` (``Captioner.load(bundle, runtime="tensorrt")``).
Only the standard library and numpy are imported here; tensorrt and cuda-python are imported when an engine is
built or run. See ``docs/tensorrt.md``.
"""

from __future__ import annotations

from edgecap._lazy import lazy_getattr

_LAZY: dict[str, str] = {
    "build_engines": "edgecap.engines.build",
    "EngineBuildError": "edgecap.engines.build",
    "EngineUnavailableError": "edgecap.engines.build",
    "BufferPlan": "edgecap.engines.buffers",
    "plan_buffers": "edgecap.engines.buffers",
    "read_graph_io": "edgecap.engines.graphs",
    "EngineProfile": "edgecap.engines.profiles",
    "ProfileRequest": "edgecap.engines.profiles",
    "graph_profile": "edgecap.engines.profiles",
    "BuildSettings": "edgecap.engines.settings",
    "build_settings": "edgecap.engines.settings",
    "EngineEnv": "edgecap.engines.store",
    "EngineMismatchError": "edgecap.engines.store",
    "find_engines": "edgecap.engines.store",
    "fitting_engines": "edgecap.engines.store",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
