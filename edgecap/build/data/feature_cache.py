"""Backbone grid features extracted once per dataset into a resumable, never-half-written on-disk cache.

ExpansionNet v2 (§4.3) trains the first step of each stage with a frozen backbone; every epoch would otherwise
recompute the same backbone output. :func:`extract_features` runs the backbone over every image once and
:class:`FeatureCache` serves the result to training as a feature source
(``get(image_id) -> (features (N, C), boxes (N, 4))``).

Layout of a cache directory::

    meta.json                 settings (backbone spec, dtype, shard size, dataset fingerprint), status, skipped images
    boxes.safetensors         "boxes" (N, 4) float32 — grid-cell boxes are the same for every image, stored once
    shard_00000.safetensors   "features" (n, N, C) float16 for images [0, shard_size), ids in the header metadata
    shard_00001.safetensors   ...
    index.json                image_id -> [shard, row]

Every file is written to a temporary sibling and renamed into place, so a crash leaves complete shards and no
partial ones. Shard ``k`` always holds the same planned images (dataset order, ``shard_size`` per shard), so a re-run
after an interruption skips finished shards and produces exactly what an uninterrupted run produces. ``meta.json``
is written first (status ``incomplete``) and rewritten last (status ``complete``): a cache is readable only once
complete, and a cache built with other settings is never silently reused (:class:`CacheMismatchError`).

Features are stored as float16 by default: half the disk and page cache of float32, and for ReLU6-bounded
EfficientNet-Lite features (range [0, 6]) the rounding error is below 2e-3 absolute — far under what a captioner
can notice. ``dtype="float32"`` stores them exactly. Non-finite values are refused instead of stored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgecap.build._progress import ProgressBar
from edgecap.build.data.datasets import CaptionDataset, load_dataset
from edgecap.runtime._io import atomic_path, atomic_write_json
from edgecap.runtime.images.load import ImageError

if TYPE_CHECKING:
    import torch

    from edgecap.build.models.backbone import Backbone

__all__ = [
    "CACHE_FORMAT",
    "CacheBusyError",
    "CacheIncompleteError",
    "CacheMismatchError",
    "FeatureCache",
    "FeatureCacheError",
    "extract_features",
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


# ----------------------------------------------------------------------------------------------- reading


def _shard_name(index: int) -> str:
    return _SHARD_PATTERN.format(index)


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
    dtype = {code: np.dtype(np_type) for code, np_type in _DTYPES.values()}.get(entry.get("dtype"))
    if dtype is None:
        raise FeatureCacheError(f"{path}: tensor {name!r} has unsupported dtype {entry.get('dtype')!r}")
    shape = tuple(int(s) for s in entry["shape"])
    begin, end = (int(v) for v in entry["data_offsets"])
    if end - begin != int(np.prod(shape)) * dtype.itemsize or data_start + end > path.stat().st_size:
        raise FeatureCacheError(f"{path}: tensor {name!r} data does not match its shape {shape} (truncated file?)")
    array = np.memmap(path, dtype=dtype, mode="r", offset=data_start + begin, shape=shape)
    return array, dict(header.get("__metadata__") or {})


class FeatureCache:
    """Read-only view of a complete feature cache; a feature source for training.

    Shards are memory-mapped on first use and kept in a small LRU, so random access costs one page-in per row and
    worker processes share the OS page cache. Instances pickle without their open maps.

    Args:
        cache_dir: the directory written by :func:`extract_features`.
        max_open_shards: how many shards stay mapped at once.

    Raises:
        FileNotFoundError: no ``meta.json`` in ``cache_dir``.
        CacheIncompleteError: the extraction that writes this cache has not finished.
        FeatureCacheError: the metadata or index is malformed.
    """

    def __init__(self, cache_dir: str | os.PathLike, max_open_shards: int = 16) -> None:
        self.dir = Path(cache_dir)
        meta_path = self.dir / META
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"no feature cache at {self.dir} (missing {META}); create it with `edgecap features --data DIR`"
            )
        self.meta = _read_json(meta_path)
        if self.meta.get("format") != CACHE_FORMAT or self.meta.get("version") != CACHE_VERSION:
            raise FeatureCacheError(f"{meta_path}: not an {CACHE_FORMAT} v{CACHE_VERSION} cache")
        if self.meta.get("status") != "complete":
            raise CacheIncompleteError(
                f"feature cache {self.dir} is incomplete (extraction interrupted?); re-run `edgecap features` "
                "with the same settings to finish it"
            )
        index = _read_json(self.dir / INDEX)
        self._index: dict[str, tuple[int, int]] = {str(k): (int(v[0]), int(v[1])) for k, v in index.items()}
        boxes, _ = _memmap_tensor(self.dir / BOXES, "boxes")
        self._boxes = np.array(boxes, dtype=np.float32)
        self.max_open_shards = max(1, int(max_open_shards))
        self._shards: OrderedDict[int, np.memmap] = OrderedDict()
        if self._boxes.shape != (self.num_cells, 4):
            raise FeatureCacheError(f"{self.dir / BOXES}: boxes {self._boxes.shape}, expected ({self.num_cells}, 4)")

    # -- metadata -----------------------------------------------------------------------------------------------

    @property
    def spec(self) -> dict[str, Any]:
        """The backbone spec (name, weights hash, image size, preprocessing, grid) the features came from."""
        return dict(self.meta["backbone"])

    @property
    def feature_dim(self) -> int:
        return int(self.meta["feature_dim"])

    @property
    def num_cells(self) -> int:
        """Feature vectors per image, ``N = h * w`` of the grid."""
        return int(self.meta["num_cells"])

    @property
    def dtype(self) -> str:
        """Storage dtype; :meth:`get` always returns float32."""
        return str(self.meta["dtype"])

    @property
    def skipped(self) -> dict[str, str]:
        """Images left out during extraction (``skip_bad=True``): id → reason."""
        return dict(self.meta.get("skipped", {}))

    @property
    def nbytes(self) -> int:
        """Bytes on disk of all cache files."""
        return sum(p.stat().st_size for p in self.dir.iterdir() if p.is_file() and not p.name.startswith("."))

    def ids(self) -> list[str]:
        """Cached image ids, in dataset order."""
        return list(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, image_id: object) -> bool:
        return image_id in self._index

    def __repr__(self) -> str:
        return (
            f"FeatureCache({str(self.dir)!r}, images={len(self)}, backbone={self.meta['backbone']['name']!r}, "
            f"size={self.meta['backbone']['image_size']}, N={self.num_cells}, C={self.feature_dim}, dtype={self.dtype})"
        )

    # -- reading ------------------------------------------------------------------------------------------------

    def _locate(self, image_id: str) -> tuple[int, int]:
        try:
            return self._index[image_id]
        except KeyError:
            reason = self.meta.get("skipped", {}).get(image_id)
            if reason is not None:
                raise KeyError(f"image {image_id!r} was skipped during extraction: {reason}") from None
            raise KeyError(f"image {image_id!r} is not in feature cache {self.dir}") from None

    def _shard(self, shard: int) -> np.memmap:
        array = self._shards.get(shard)
        if array is not None:
            self._shards.move_to_end(shard)
            return array
        path = self.dir / _shard_name(shard)
        array, _ = _memmap_tensor(path, "features")
        if array.ndim != 3 or array.shape[1:] != (self.num_cells, self.feature_dim):
            raise FeatureCacheError(
                f"{path}: features {array.shape}, expected (n, {self.num_cells}, {self.feature_dim})"
            )
        self._shards[shard] = array
        while len(self._shards) > self.max_open_shards:
            self._shards.popitem(last=False)
        return array

    def get(self, image_id: str) -> tuple[np.ndarray, np.ndarray]:
        """Features ``(N, C)`` float32 and boxes ``(N, 4)`` float32 (normalised ``x1, y1, x2, y2``) of one image.

        Raises:
            KeyError: the image is not cached (the message says when it was skipped as unreadable).
        """
        shard, row = self._locate(image_id)
        return np.asarray(self._shard(shard)[row], dtype=np.float32), self._boxes.copy()

    def get_batch(self, image_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Features ``(B, N, C)`` float32 and boxes ``(B, N, 4)``, reading each shard once with sorted rows."""
        locations = [self._locate(i) for i in image_ids]
        out = np.empty((len(image_ids), self.num_cells, self.feature_dim), dtype=np.float32)
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for position, (shard, row) in enumerate(locations):
            by_shard.setdefault(shard, []).append((row, position))
        for shard, pairs in by_shard.items():
            pairs.sort()
            rows = np.fromiter((r for r, _ in pairs), dtype=np.int64, count=len(pairs))
            positions = np.fromiter((p for _, p in pairs), dtype=np.int64, count=len(pairs))
            out[positions] = self._shard(shard)[rows]
        boxes = np.broadcast_to(self._boxes, (len(image_ids), self.num_cells, 4)).copy()
        return out, boxes

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_shards"] = OrderedDict()
        return state


# ----------------------------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class _Item:
    image_id: str
    path: Path


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FeatureCacheError(f"feature cache file missing: {path}") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FeatureCacheError(f"{path}: unreadable ({exc})") from exc


def _dataset_items(dataset: str | os.PathLike | CaptionDataset) -> tuple[list[_Item], str, str]:
    """Images to extract (dataset order), plus a display path and name for the metadata."""
    if isinstance(dataset, (str, os.PathLike)):
        loaded, where = load_dataset(dataset), str(Path(dataset).resolve())
    else:
        loaded, where = dataset, ""
    items = []
    for record in loaded.records:
        if record.path is None:
            raise ValueError(f"dataset {loaded.name!r}: image {record.image_id!r} has no image file path")
        items.append(_Item(record.image_id, Path(record.path)))
    if not items:
        raise ValueError(f"dataset {loaded.name!r} has no images")
    return items, where, loaded.name


def _fingerprint(items: Sequence[_Item]) -> str:
    """Hash of (id, path relative to the common image folder, file size) in order: detects a changed dataset
    (new/removed/renamed/regenerated images) while surviving a move of the whole dataset folder."""
    root = os.path.commonpath([str(item.path.parent) for item in items])
    digest = hashlib.sha256()
    for item in items:
        try:
            size = item.path.stat().st_size
        except OSError:
            size = -1
        digest.update(f"{item.image_id}\t{os.path.relpath(item.path, root)}\t{size}\n".encode())
    return digest.hexdigest()


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


def _load_batch(
    items: Sequence[_Item], preprocess: Callable[[Any], np.ndarray], pool: ThreadPoolExecutor | None
) -> list[Future | np.ndarray | ImageError]:
    def one(item: _Item) -> np.ndarray | ImageError:
        try:
            return preprocess(item.path)
        except ImageError as exc:  # FileNotFoundError subclasses included (ImageNotFoundError)
            return exc

    if pool is None:
        return [one(item) for item in items]
    return [pool.submit(one, item) for item in items]


def _batches(items: Sequence[_Item], batch_size: int, preprocess: Callable, workers: int) -> Iterator[tuple]:
    """Yield (items, results) per batch; with workers the next batch decodes while the model runs."""
    starts = range(0, len(items), batch_size)
    if workers <= 0:
        for start in starts:
            chunk = items[start : start + batch_size]
            yield chunk, _load_batch(chunk, preprocess, None)
        return
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="edgecap-images")
    try:
        pending = None
        for start in starts:
            chunk = items[start : start + batch_size]
            future = (chunk, _load_batch(chunk, preprocess, pool))
            if pending is not None:
                yield pending[0], [f.result() for f in pending[1]]
            pending = future
        if pending is not None:
            yield pending[0], [f.result() for f in pending[1]]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _ShardRun:
    """Accumulates one shard: forwards decoded batches, keeps features in the storage dtype, records bad images."""

    def __init__(self, backbone: Backbone, np_dtype: type, skip_bad: bool, cache_dir: Path) -> None:
        self.backbone, self.np_dtype, self.skip_bad, self.cache_dir = backbone, np_dtype, skip_bad, cache_dir
        self.device = next(backbone.parameters()).device
        self.ids: list[str] = []
        self.skipped: dict[str, str] = {}
        self._parts: list[np.ndarray] = []

    def add(self, items: Sequence[_Item], results: Sequence[np.ndarray | ImageError]) -> None:
        import torch

        good: list[tuple[_Item, np.ndarray]] = []
        for item, result in zip(items, results, strict=True):
            if not isinstance(result, ImageError):
                good.append((item, result))
            elif self.skip_bad:
                self.skipped[item.image_id] = str(result)
            else:
                raise type(result)(
                    f"{result} [image id {item.image_id}]; finished shards are kept in {self.cache_dir}: fix or "
                    "remove the image and re-run to resume, or pass --skip-bad (skip_bad=True)"
                ) from result
        if not good:
            return
        pixels = torch.from_numpy(np.stack([pixels for _, pixels in good])).to(self.device)
        with torch.inference_mode():
            features = self.backbone(pixels)[0].float().cpu().numpy()
        with np.errstate(over="ignore"):  # overflow is detected and reported just below
            stored = features.astype(self.np_dtype)
        finite = np.isfinite(stored).all(axis=(1, 2))
        if not finite.all():
            path = good[int(np.flatnonzero(~finite)[0])][0].path
            overflow = bool(np.isfinite(features).all())
            hint = "; the values overflow float16 — use dtype='float32'" if overflow else ""
            raise FeatureCacheError(f"non-finite features for {path}{hint}")
        self._parts.append(stored)
        self.ids.extend(item.image_id for item, _ in good)

    def features(self) -> np.ndarray:
        if self._parts:
            return np.concatenate(self._parts)
        return np.empty((0, self.backbone.num_cells, self.backbone.feature_dim), dtype=self.np_dtype)


def extract_features(
    dataset: str | os.PathLike | CaptionDataset,
    cache_dir: str | os.PathLike,
    backbone_name: str = "tf_efficientnet_lite0",
    image_size: int = 224,
    batch_size: int = 32,
    weights: str | os.PathLike | None = None,
    progress: bool = True,
    *,
    backbone: Backbone | None = None,
    dtype: str = "float16",
    shard_size: int = 256,
    skip_bad: bool = False,
    overwrite: bool = False,
    device: str | torch.device = "cpu",
    num_workers: int | None = None,
) -> FeatureCache:
    """Extract backbone features for every image of ``dataset`` into ``cache_dir`` (resuming a partial cache).

    Args:
        dataset: a dataset directory / JSON file (read with :func:`~edgecap.build.data.datasets.load_dataset`) or a
            :class:`~edgecap.build.data.datasets.CaptionDataset`.
        cache_dir: output directory (created; must be new, empty, or a cache with the same settings).
        backbone_name, image_size, weights: passed to :func:`~edgecap.build.models.backbone.create_backbone`.
        batch_size: images per forward pass.
        progress: show a progress bar.
        backbone: an already built backbone; overrides ``backbone_name``/``image_size``/``weights``.
        dtype: ``"float16"`` (default, half the size) or ``"float32"`` storage.
        shard_size: images per shard file, the unit of resumption.
        skip_bad: record unreadable images in ``meta.json["skipped"]`` and go on, instead of stopping at the first
            one with its :class:`~edgecap.runtime.images.load.ImageError` (default: a demanding user wants to know, and
            the finished shards are kept, so fixing the file and re-running resumes).
        overwrite: delete an existing cache in ``cache_dir`` first instead of refusing a mismatch.
        device: where the backbone runs.
        num_workers: image-decoding threads overlapping with the forward pass (default: ``min(4, cpu_count)``;
            ``0`` decodes in the main thread). Torch's own thread count (``torch.get_num_threads()``) is not changed.

    Returns:
        The complete cache.

    Raises:
        CacheMismatchError: ``cache_dir`` holds a cache made with other settings and ``overwrite`` is False.
        CacheBusyError: another process is extracting into ``cache_dir``.
        ImageError: an image is unreadable and ``skip_bad`` is False.
    """
    import torch

    from edgecap.build.models.backbone import create_backbone, grid_boxes

    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    if batch_size < 1 or shard_size < 1:
        raise ValueError(f"batch_size and shard_size must be >= 1, got {batch_size} and {shard_size}")
    cache_dir = Path(cache_dir)
    items, dataset_where, dataset_name = _dataset_items(dataset)
    if backbone is None:
        backbone = create_backbone(backbone_name, pretrained=True, weights=weights, image_size=image_size)
    backbone = backbone.to(device).eval()
    spec = backbone.spec
    num_cells = int(spec["grid"][0]) * int(spec["grid"][1])
    code, np_dtype = _DTYPES[dtype]
    settings = {
        "format": CACHE_FORMAT,
        "version": CACHE_VERSION,
        "status": "incomplete",
        "backbone": spec,
        "dtype": dtype,
        "shard_size": shard_size,
        "num_cells": num_cells,
        "feature_dim": backbone.feature_dim,
        "dataset": {
            "path": dataset_where,
            "name": dataset_name,
            "num_images": len(items),
            "fingerprint": _fingerprint(items),
        },
    }
    workers = min(4, os.cpu_count() or 1) if num_workers is None else max(0, int(num_workers))

    cache_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive(cache_dir):
        existing = _prepare_dir(cache_dir, overwrite)
        if existing is not None:
            _check_same_settings(cache_dir, existing, settings)
            if existing.get("status") == "complete":
                return FeatureCache(cache_dir)
        atomic_write_json(cache_dir / META, settings)
        height, width = spec["grid"]
        _write_boxes(cache_dir / BOXES, grid_boxes(int(height), int(width)).numpy())

        chunks = [items[i : i + shard_size] for i in range(0, len(items), shard_size)]
        done: dict[int, dict] = {}
        for k, chunk in enumerate(chunks):
            found = _valid_shard(
                cache_dir / _shard_name(k), [i.image_id for i in chunk], num_cells, backbone.feature_dim, code
            )
            if found is not None:
                done[k] = found
        for stray in cache_dir.glob("shard_*.safetensors"):  # shards beyond the plan (should not exist)
            if stray.name not in {_shard_name(k) for k in range(len(chunks))}:
                stray.unlink()

        start, extracted = time.perf_counter(), 0
        bar = ProgressBar(
            len(items),
            f"features {spec['name']}@{spec['image_size']}",
            enabled=progress,
            initial=sum(len(chunks[k]) for k in done),
        )
        try:
            for k, chunk in enumerate(chunks):
                if k in done:
                    continue
                run = _ShardRun(backbone, np_dtype, skip_bad, cache_dir)
                # closing(): stop the decoding threads now, not when an exception's traceback is freed
                with contextlib.closing(_batches(chunk, batch_size, backbone.preprocess_cfg, workers)) as batches:
                    for batch_items, results in batches:
                        run.add(batch_items, results)
                        bar.update(len(batch_items))
                _write_shard(
                    cache_dir / _shard_name(k), run.features(), run.ids, run.skipped, [i.image_id for i in chunk]
                )
                done[k] = {"ids": run.ids, "skipped": run.skipped}
                extracted += len(run.ids)
        finally:
            bar.close()
        seconds = time.perf_counter() - start

        index = {image_id: [k, row] for k in sorted(done) for row, image_id in enumerate(done[k]["ids"])}
        atomic_write_json(cache_dir / INDEX, index)
        settings["status"] = "complete"
        settings["num_images"] = len(index)
        settings["skipped"] = {i: r for k in sorted(done) for i, r in done[k]["skipped"].items()}
        settings["extraction"] = {
            "images_extracted": extracted,
            "seconds": round(seconds, 3),
            "images_per_second": round(extracted / seconds, 2) if seconds > 0 and extracted else None,
            "batch_size": batch_size,
            "device": str(next(backbone.parameters()).device),
            "torch_threads": torch.get_num_threads(),
            "decode_threads": workers,
            "versions": {"torch": torch.__version__, "timm": _timm_version()},
        }
        atomic_write_json(cache_dir / META, settings)
    return FeatureCache(cache_dir)


def _timm_version() -> str:
    import timm

    return str(timm.__version__)
