"""ONNX Runtime on a GPU: the TensorRT execution provider's options, built by pure functions (tested on CPU).

- **Engine and timing caches inside the bundle**, in a hidden directory (``.onnxruntime-trt/<precision>-<digest>``:
  hidden entries are outside the manifest, so the bundle stays verifiable), keyed by the decoder graph's checksum so a
  re-exported graph never meets a stale engine; TensorRT's own cache files carry the GPU and TensorRT version. A
  read-only bundle (a system install) caches under ``$EDGECAP_HOME/trt-engines`` instead.
- **Optimisation profiles from the bundle's dims** (``interface.dims``: rows 1..max, cache length 0..max_len - 1,
  regions): without explicit profiles the EP rebuilds an engine whenever a decoder step meets a cache length outside
  the shapes it has seen, i.e. on most steps of a first decode. Each profile's *max* is the manifest's limit (every
  shape the graphs were exported for runs); its *opt*, the shape TensorRT tunes its kernels and sizes its build for,
  is a typical call (:func:`trt_opt_sizes`: :data:`DEFAULT_TRT_OPT_BATCH` images, times the beam for the step graph,
  half the cache length), not the maximum: tuning at 1024 rows can exhaust a small GPU while the engine is built.
- **A bounded workspace**: since onnxruntime 1.19 the EP sets no workspace limit of its own (TensorRT may then use
  the whole device memory for a layer's scratch space while it builds); edgecap sets ``trt_max_workspace_size`` to
  :data:`DEFAULT_TRT_WORKSPACE_MB` unless told otherwise, which fits the unified memory of a Jetson Orin Nano.
- **Version gates**: options newer than the installed onnxruntime are left out rather than refused at session
  creation (profiles since 1.15, the timing-cache path since 1.16); Jetson users on JetPack 6 get 1.18 or newer.

Precision flags follow the graphs: FP16 graphs set ``trt_fp16_enable``; INT8 graphs are QDQ (explicit quantisation),
so ``trt_int8_enable`` is set with no calibration table (TensorRT reads the scales from the Q/DQ nodes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgecap.runtime._versions import InvalidVersion, release
from edgecap.runtime.precisions import PRECISIONS

__all__ = [
    "DEFAULT_TRT_OPT_BATCH",
    "DEFAULT_TRT_WORKSPACE_MB",
    "TRT_OPTION_SINCE",
    "graph_profile_options",
    "onnxruntime_version_tuple",
    "tensorrt_cache_dir",
    "tensorrt_ep_options",
    "trt_opt_sizes",
    "trt_profile_shapes",
]


#: Provider options and the onnxruntime (major, minor) that introduced them.
TRT_OPTION_SINCE: dict[str, tuple[int, int]] = {
    "trt_profile_min_shapes": (1, 15),
    "trt_profile_opt_shapes": (1, 15),
    "trt_profile_max_shapes": (1, 15),
    "trt_timing_cache_path": (1, 16),
}
#: The hidden directory of a bundle that holds ONNX Runtime's TensorRT engines.
CACHE_DIRNAME = ".onnxruntime-trt"
#: Its name in bundles used by earlier versions, whose engines are still used when they are there.
LEGACY_CACHE_DIRNAMES = (".ort-trt",)
#: Images per call the optimisation profiles are tuned for unless told (``trt_opt_batch``): the largest batch
#: ``edgecap bench`` measures by default (its offline scenario), a typical ``Captioner.batch`` call.
DEFAULT_TRT_OPT_BATCH = 8
#: TensorRT's workspace limit in MiB unless told (``trt_workspace_mb``): 1 GiB, a quarter of a Jetson Orin Nano
#: 4 GB's unified memory; a captioner's layers need far less, and TensorRT skips tactics that would need more.
DEFAULT_TRT_WORKSPACE_MB = 1024
#: Roles whose graph runs once per hypothesis (rows = images × beam); the others run once per image.
_PER_HYPOTHESIS = frozenset({"step"})


def onnxruntime_version_tuple(version: str) -> tuple[int, int]:
    """``"1.18.1"`` -> ``(1, 18)``; ``"1.20.0.dev2024"`` and ``"1.20.0+cu12"`` -> ``(1, 20)``: a nightly or local
    build has its release's options."""
    try:
        major, minor = release(version, 2)
    except InvalidVersion:
        raise ValueError(f"not an onnxruntime version: {version!r}") from None
    return major, minor


def trt_profile_shapes(
    inputs: Mapping[str, Sequence[int | str | None]],
    dims: Mapping[str, Mapping[str, int]],
    opt: Mapping[str, int] | None = None,
) -> dict[str, str]:
    """TensorRT EP profile options for a graph whose inputs have named dynamic dimensions.

    Args:
        inputs: input name -> shape; integers are fixed, strings name a dimension of ``dims``.
        dims: dimension name -> ``{"min", "max"}`` (the bundle's ``interface.dims``).
        opt: dimension name -> the size TensorRT tunes for; default each dimension's maximum.

    Returns:
        ``trt_profile_min_shapes``, ``trt_profile_opt_shapes`` and ``trt_profile_max_shapes`` as the EP's
        ``"name:AxBxC,name2:..."`` strings.

    Raises:
        ValueError: a dimension without a name, or one ``dims`` does not bound.
    """
    shapes: dict[str, list[str]] = {"min": [], "opt": [], "max": []}
    for name, shape in inputs.items():
        sizes: dict[str, list[int]] = {"min": [], "opt": [], "max": []}
        for axis, dim in enumerate(shape):
            if isinstance(dim, int):
                for key in sizes:
                    sizes[key].append(dim)
                continue
            if not isinstance(dim, str) or dim not in dims:
                raise ValueError(
                    f"input {name!r} axis {axis}: dimension {dim!r} has no bounds in the bundle's dims {sorted(dims)}"
                )
            low, high = int(dims[dim]["min"]), int(dims[dim]["max"])
            best = int((opt or {}).get(dim, high))
            if not low <= best <= high:
                raise ValueError(f"opt size {best} of dimension {dim!r} is outside [{low}, {high}]")
            sizes["min"].append(low)
            sizes["opt"].append(best)
            sizes["max"].append(high)
        for key in shapes:
            shapes[key].append(f"{name}:{'x'.join(map(str, sizes[key]))}")
    return {f"trt_profile_{key}_shapes": ",".join(value) for key, value in shapes.items()}


def trt_opt_sizes(dims: Mapping[str, Mapping[str, int]], role: str | None, batch: int, beam: int = 1) -> dict[str, int]:
    """The sizes TensorRT tunes ``role``'s graph for (the ``opt`` of :func:`trt_profile_shapes`), each within the
    bundle's bounds: ``batch`` rows (``batch × beam`` for the step graph, which runs once per hypothesis), ``batch``
    rows of image states (``images``: fed once per image), half the cache length (``past``: where an average caption
    spends its steps). Other dimensions keep their maximum.

    Args:
        dims: the bundle's ``interface.dims`` (name -> ``{"min", "max"}``).
        role: ``"encoder"``, ``"step"`` or ``"refine"`` (None: counted once per image).
        batch: images per call.
        beam: the beam width the step graph's rows multiply ``batch`` by.

    Raises:
        ValueError: ``batch`` or ``beam`` below 1.
    """
    if batch < 1 or beam < 1:
        raise ValueError(f"the TensorRT opt batch and beam must be >= 1, got batch {batch}, beam {beam}")
    rows = batch * (beam if role in _PER_HYPOTHESIS else 1)
    wanted: dict[str, int] = {"batch": rows, "images": batch}
    sizes = {}
    for name, bounds in dims.items():
        low, high = int(bounds["min"]), int(bounds["max"])
        if name == "past":
            sizes[name] = (low + high) // 2
        elif name in wanted:
            sizes[name] = min(max(wanted[name], low), high)
    return sizes


def graph_profile_options(
    onnxruntime: Any,
    source: str | bytes,
    dims: Mapping[str, Mapping[str, int]],
    role: str | None = None,
    opt_batch: int | None = None,
    beam: int = 1,
) -> dict[str, str]:
    """:func:`trt_profile_shapes` for one graph's own inputs, read from a metadata-only CPU session on ``source`` (a
    path or serialized bytes), tuned by :func:`trt_opt_sizes` for ``role`` (None: the graph's ``graph_role``
    metadata) at ``opt_batch`` images (None: :data:`DEFAULT_TRT_OPT_BATCH`); empty when this onnxruntime predates
    explicit profiles.

    Raises:
        ValueError: an input dimension ``dims`` does not bound.
    """
    if onnxruntime_version_tuple(onnxruntime.__version__) < TRT_OPTION_SINCE["trt_profile_min_shapes"]:
        return {}
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    probe = onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    inputs = {i.name: [d if isinstance(d, (int, str)) else None for d in i.shape] for i in probe.get_inputs()}
    role = role or probe.get_modelmeta().custom_metadata_map.get("graph_role")
    opt = trt_opt_sizes(dims, "encoder" if role == "init" else role, opt_batch or DEFAULT_TRT_OPT_BATCH, beam)
    return trt_profile_shapes(inputs, dims, opt)


def tensorrt_cache_dir(bundle_dir: str | Path, precision: str, digest: str, home: str | Path) -> Path:
    """Where the EP's engines for one precision of a bundle live: inside the bundle when it is writable (in
    :data:`CACHE_DIRNAME`, or in a :data:`LEGACY_CACHE_DIRNAMES` directory that already holds these engines, so an
    earlier version's build is not repeated), else under ``home/trt-engines`` (named by bundle, precision and
    decoder digest, so two bundles never share engines)."""
    bundle_dir = Path(bundle_dir)
    key = f"{precision}-{digest[:16]}"
    if os.access(bundle_dir, os.W_OK):
        from edgecap.runtime.bundle.manifest import bundle_file  # a symlinked cache may not lead out of the bundle

        legacy = [name for name in LEGACY_CACHE_DIRNAMES if (bundle_dir / name / key).is_dir()]
        folder = CACHE_DIRNAME if (bundle_dir / CACHE_DIRNAME / key).is_dir() or not legacy else legacy[0]
        return bundle_file(bundle_dir, f"{folder}/{key}", "the TensorRT EP's engine cache")
    return Path(home) / "trt-engines" / f"{bundle_dir.name}-{key}"


def tensorrt_ep_options(
    cache_dir: str | Path,
    precision: str,
    onnxruntime_version: str,
    *,
    profiles: Mapping[str, str] | None = None,
    timing_cache: bool = True,
    workspace_mb: int | None = DEFAULT_TRT_WORKSPACE_MB,
    device_id: int = 0,
    sparsity: bool = False,
) -> dict[str, Any]:
    """The TensorRT EP's provider options for graphs of ``precision`` (``fp32``, ``fp16``, ``int8``).

    Args:
        cache_dir: engine (and timing) cache directory; created by the caller.
        precision: the bundle variant the graphs come from.
        onnxruntime_version: ``onnxruntime.__version__``; options it predates are left out.
        profiles: :func:`trt_profile_shapes` output, or None (the EP then builds engines per shape seen).
        timing_cache: keep TensorRT's timing cache next to the engines (faster rebuilds on the same GPU).
        workspace_mb: TensorRT's workspace limit in MiB (default :data:`DEFAULT_TRT_WORKSPACE_MB`); None leaves the
            EP's own (no limit since onnxruntime 1.19).
        device_id: the CUDA device.
        sparsity: ``trt_sparsity_enable`` (TensorRT's sparse weights: 2:4 sparse tensor cores on Ampere and later);
            the loader turns it on when the manifest records 2:4 sparsity.

    Raises:
        ValueError: an unknown precision or a non-positive workspace.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if workspace_mb is not None and workspace_mb <= 0:
        raise ValueError(f"workspace_mb must be positive, got {workspace_mb}")
    version = onnxruntime_version_tuple(onnxruntime_version)
    options: dict[str, Any] = {
        "device_id": device_id,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache_dir),
        "trt_fp16_enable": precision == "fp16",
        "trt_int8_enable": precision == "int8",
        "trt_sparsity_enable": bool(sparsity),
        "trt_timing_cache_enable": bool(timing_cache),
    }
    if timing_cache:
        options["trt_timing_cache_path"] = str(cache_dir)
    if workspace_mb is not None:
        options["trt_max_workspace_size"] = int(workspace_mb) << 20
    if profiles:
        options.update(profiles)
    return {k: v for k, v in options.items() if version >= TRT_OPTION_SINCE.get(k, (0, 0))}
