"""ONNX Runtime on a GPU: the TensorRT execution provider's options, built by pure functions (tested on CPU).

- **Engine and timing caches inside the bundle**, in a hidden directory (``.ort-trt/<precision>-<digest>``: hidden
  entries are outside the manifest, so the bundle stays verifiable), keyed by the decoder graph's checksum so a
  re-exported graph never meets a stale engine; TensorRT's own cache files carry the GPU and TensorRT version. A
  read-only bundle (a system install) caches under ``$EDGECAP_HOME/trt-engines`` instead.
- **Optimisation profiles from the bundle's dims** (``interface.dims``: rows 1..max, cache length 0..max_len - 1,
  regions): without explicit profiles the EP rebuilds an engine whenever a decoder step meets a cache length outside
  the shapes it has seen, i.e. on most steps of a first decode.
- **Version gates**: options newer than the installed onnxruntime are left out rather than refused at session
  creation (profiles since 1.15, the timing-cache path since 1.16); Jetson users on JetPack 6 get 1.18 or newer.

Precision flags follow the graphs: FP16 graphs set ``trt_fp16_enable``; INT8 graphs are QDQ (explicit quantisation),
so ``trt_int8_enable`` is set with no calibration table (TensorRT reads the scales from the Q/DQ nodes).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgecap.precisions import PRECISIONS

__all__ = [
    "TRT_OPTION_SINCE",
    "ort_version_tuple",
    "tensorrt_cache_dir",
    "tensorrt_ep_options",
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
CACHE_DIRNAME = ".ort-trt"


def ort_version_tuple(version: str) -> tuple[int, int]:
    """``"1.18.1"`` -> ``(1, 18)``; ``"1.20.0.dev2024"`` -> ``(1, 20)``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not an onnxruntime version: {version!r}")
    return int(match.group(1)), int(match.group(2))


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


def tensorrt_cache_dir(bundle_dir: str | Path, precision: str, digest: str, home: str | Path) -> Path:
    """Where the EP's engines for one precision of a bundle live: inside the bundle when it is writable, else under
    ``home/trt-engines`` (named by bundle, precision and decoder digest, so two bundles never share engines)."""
    bundle_dir = Path(bundle_dir)
    key = f"{precision}-{digest[:16]}"
    if os.access(bundle_dir, os.W_OK):
        from edgecap.bundle.manifest import bundle_file  # a symlinked cache may not lead out of the bundle

        return bundle_file(bundle_dir, f"{CACHE_DIRNAME}/{key}", "the TensorRT EP's engine cache")
    return Path(home) / "trt-engines" / f"{bundle_dir.name}-{key}"


def tensorrt_ep_options(
    cache_dir: str | Path,
    precision: str,
    ort_version: str,
    *,
    profiles: Mapping[str, str] | None = None,
    timing_cache: bool = True,
    workspace_mb: int | None = None,
    device_id: int = 0,
) -> dict[str, Any]:
    """The TensorRT EP's provider options for graphs of ``precision`` (``fp32``, ``fp16``, ``int8``).

    Args:
        cache_dir: engine (and timing) cache directory; created by the caller.
        precision: the bundle variant the graphs come from.
        ort_version: ``onnxruntime.__version__``; options it predates are left out.
        profiles: :func:`trt_profile_shapes` output, or None (the EP then builds engines per shape seen).
        timing_cache: keep TensorRT's timing cache next to the engines (faster rebuilds on the same GPU).
        workspace_mb: TensorRT's workspace limit; None keeps the EP's default.
        device_id: the CUDA device.

    Raises:
        ValueError: an unknown precision or a non-positive workspace.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if workspace_mb is not None and workspace_mb <= 0:
        raise ValueError(f"workspace_mb must be positive, got {workspace_mb}")
    version = ort_version_tuple(ort_version)
    options: dict[str, Any] = {
        "device_id": device_id,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache_dir),
        "trt_fp16_enable": precision == "fp16",
        "trt_int8_enable": precision == "int8",
        "trt_timing_cache_enable": bool(timing_cache),
    }
    if timing_cache:
        options["trt_timing_cache_path"] = str(cache_dir)
    if workspace_mb is not None:
        options["trt_max_workspace_size"] = int(workspace_mb) << 20
    if profiles:
        options.update(profiles)
    return {k: v for k, v in options.items() if version >= TRT_OPTION_SINCE.get(k, (0, 0))}
