"""The feature cache's on-disk format: file names, storage dtypes, errors, and zero-copy reads of its safetensors
files — what both the reader (:mod:`edgecap.workshop.data.feature_cache_reader`) and the writer
(:mod:`edgecap.workshop.data.feature_cache_store`, :mod:`edgecap.workshop.data.feature_extraction`) agree on.

The layout is described in :mod:`edgecap.workshop.data.feature_cache`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BOXES",
    "CACHE_FORMAT",
    "CACHE_VERSION",
    "INDEX",
    "LOCK",
    "META",
    "CacheBusyError",
    "CacheIncompleteError",
    "CacheMismatchError",
    "FeatureCacheError",
]

CACHE_FORMAT = "edgecap-feature-cache"
CACHE_VERSION = 1
META, INDEX, BOXES, LOCK = "meta.json", "index.json", "boxes.safetensors", ".lock"
_SHARD_PATTERN = "shard_{:05d}.safetensors"
_DTYPES = {"float16": ("F16", np.float16), "float32": ("F32", np.float32)}


class FeatureCacheError(ValueError):
    """A feature cache is unreadable or inconsistent."""


class CacheMismatchError(FeatureCacheError):
    """The directory holds a cache built with other settings (backbone, weights, size, preprocessing, data)."""


class CacheIncompleteError(FeatureCacheError):
    """The cache's extraction has not finished; re-run the extraction to complete it."""


class CacheBusyError(RuntimeError):
    """Another process is writing this cache right now."""


def _shard_name(index: int) -> str:
    return _SHARD_PATTERN.format(index)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FeatureCacheError(f"feature cache file missing: {path}") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FeatureCacheError(f"{path}: unreadable ({exc})") from exc


def _read_safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a ``.safetensors`` file and the byte offset where its data starts."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100_000_000:
                raise FeatureCacheError(f"{path}: implausible safetensors header length {length}")
            header = json.loads(f.read(length))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FeatureCacheError(f"{path}: not a readable safetensors file ({exc})") from exc
    if not isinstance(header, dict):
        raise FeatureCacheError(f"{path}: malformed safetensors header")
    return header, 8 + length


def _memmap_tensor(path: Path, name: str) -> tuple[np.memmap, dict[str, str]]:
    """Map one tensor of a safetensors file read-only (zero copy; rows are paged in on access)."""
    header, data_start = _read_safetensors_header(path)
    entry = header.get(name)
    if not isinstance(entry, dict):
        raise FeatureCacheError(f"{path}: no tensor {name!r}")
    by_code: dict[object, np.dtype] = {code: np.dtype(np_type) for code, np_type in _DTYPES.values()}
    dtype = by_code.get(entry.get("dtype"))
    if dtype is None:
        raise FeatureCacheError(f"{path}: tensor {name!r} has unsupported dtype {entry.get('dtype')!r}")
    shape = tuple(int(s) for s in entry["shape"])
    begin, end = (int(v) for v in entry["data_offsets"])
    if end - begin != int(np.prod(shape)) * dtype.itemsize or data_start + end > path.stat().st_size:
        raise FeatureCacheError(f"{path}: tensor {name!r} data does not match its shape {shape} (truncated file?)")
    array = np.memmap(path, dtype=dtype, mode="r", offset=data_start + begin, shape=shape)
    return array, dict(header.get("__metadata__") or {})
