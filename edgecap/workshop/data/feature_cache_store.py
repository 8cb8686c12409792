"""The cache directory on the writing side: one writer at a time, settings that must match before a cache is
resumed, shards that are reused only when they hold exactly the planned images, and atomic shard writes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.runtime._io import atomic_path
from edgecap.workshop.data.feature_cache_format import (
    BOXES,
    CACHE_FORMAT,
    CACHE_VERSION,
    INDEX,
    LOCK,
    META,
    CacheBusyError,
    CacheMismatchError,
    FeatureCacheError,
    _read_json,
    _read_safetensors_header,
)


def _chunk_hash(ids: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


def _comparable(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings that decide the cache's content (a renamed weights file with the same hash still matches)."""
    backbone = dict(settings["backbone"])
    weights = backbone.pop("weights", {}) or {}
    flat = {f"backbone.{k}": v for k, v in backbone.items()}
    flat["backbone.weights.sha256"] = weights.get("sha256")
    flat.update({k: settings[k] for k in ("dtype", "shard_size", "num_cells", "feature_dim")})
    flat["dataset.fingerprint"] = settings["dataset"]["fingerprint"]
    flat["dataset.num_images"] = settings["dataset"]["num_images"]
    return json.loads(json.dumps(flat))  # tuples → lists, as they come back from meta.json


def _check_same_settings(cache_dir: Path, existing: dict[str, Any], wanted: dict[str, Any]) -> None:
    if existing.get("format") != CACHE_FORMAT or existing.get("version") != CACHE_VERSION:
        raise CacheMismatchError(
            f"{cache_dir / META} is not an {CACHE_FORMAT} v{CACHE_VERSION} cache; pass --overwrite "
            "(overwrite=True) to rebuild it, or choose another output directory"
        )
    try:
        have = _comparable(existing)
    except (KeyError, TypeError) as exc:
        raise CacheMismatchError(f"{cache_dir / META}: malformed metadata ({exc}); pass --overwrite") from exc
    want = _comparable(wanted)
    diffs = [
        f"{key}: cache has {have.get(key)!r}, requested {want[key]!r}" for key in want if have.get(key) != want[key]
    ]
    if diffs:
        raise CacheMismatchError(
            f"feature cache {cache_dir} was built with different settings:\n  "
            + "\n  ".join(diffs)
            + "\nPass --overwrite (overwrite=True) to rebuild it, or choose another output directory."
        )


def _is_cache_file(name: str) -> bool:
    return (
        name in (META, INDEX, BOXES, LOCK)
        or (name.startswith("shard_") and name.endswith(".safetensors"))
        or (name.startswith(".") and name.endswith(".tmp"))
    )


def _prepare_dir(cache_dir: Path, overwrite: bool) -> dict[str, Any] | None:
    """Existing metadata (None for a fresh directory); wipes our own files when overwriting."""
    foreign = sorted(p.name for p in cache_dir.iterdir() if not _is_cache_file(p.name))
    if foreign:
        raise FeatureCacheError(
            f"{cache_dir} holds files that are not part of a feature cache ({', '.join(foreign[:5])}); "
            "choose an empty or new output directory"
        )
    for stale in cache_dir.glob(".*.tmp"):  # left by a killed process; atomic writes never rename them
        stale.unlink(missing_ok=True)
    if overwrite:
        for path in cache_dir.iterdir():
            if path.name != LOCK:
                path.unlink()
        return None
    if not (cache_dir / META).is_file():
        if any(p.name != LOCK for p in cache_dir.iterdir()):
            raise FeatureCacheError(f"{cache_dir} has shards but no {META}; pass --overwrite to rebuild it")
        return None
    return _read_json(cache_dir / META)


@contextlib.contextmanager
def _exclusive(cache_dir: Path) -> Iterator[None]:
    """Refuse to run two extractions into one directory at once (advisory lock, POSIX only)."""
    if sys.platform == "win32":  # pragma: no cover
        yield
        return
    import fcntl

    with open(cache_dir / LOCK, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CacheBusyError(f"another process is writing the feature cache {cache_dir}") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _valid_shard(path: Path, chunk: Sequence[str], num_cells: int, feature_dim: int, code: str) -> dict | None:
    """The shard's (ids, skipped) when it holds exactly the planned chunk, else None (it is then rebuilt)."""
    if not path.is_file():
        return None
    try:
        header, data_start = _read_safetensors_header(path)
        meta = header.get("__metadata__") or {}
        ids, skipped = json.loads(meta["image_ids"]), json.loads(meta["skipped"])
        entry = header["features"]
        size_ok = data_start + int(entry["data_offsets"][1]) == path.stat().st_size
    except (FeatureCacheError, KeyError, TypeError, ValueError):
        return None
    if (
        meta.get("chunk") != _chunk_hash(chunk)
        or entry.get("dtype") != code
        or entry.get("shape") != [len(ids), num_cells, feature_dim]
        or not size_ok
        or sorted(ids + list(skipped)) != sorted(chunk)
    ):
        return None
    return {"ids": ids, "skipped": skipped}


def _write_shard(
    path: Path, features: np.ndarray, ids: list[str], skipped: dict[str, str], chunk: Sequence[str]
) -> None:
    from safetensors.numpy import save_file

    metadata = {"image_ids": json.dumps(ids), "skipped": json.dumps(skipped), "chunk": _chunk_hash(chunk)}
    with atomic_path(path) as tmp:
        save_file({"features": np.ascontiguousarray(features)}, str(tmp), metadata=metadata)


def _write_boxes(path: Path, boxes: np.ndarray) -> None:
    from safetensors.numpy import save_file

    with atomic_path(path) as tmp:
        save_file({"boxes": np.ascontiguousarray(boxes, dtype=np.float32)}, str(tmp))
