"""Running a backbone over every image of a dataset into a feature cache (:func:`extract_features`): decoding on
worker threads while the model runs, one shard at a time, resuming after an interruption."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from edgecap.runtime._io import atomic_write_json
from edgecap.runtime.images.load import ImageError
from edgecap.workshop._progress import ProgressBar
from edgecap.workshop.data.datasets import CaptionDataset, load_dataset
from edgecap.workshop.data.feature_cache_format import (
    _DTYPES,
    BOXES,
    CACHE_FORMAT,
    CACHE_VERSION,
    INDEX,
    META,
    FeatureCacheError,
    _shard_name,
)
from edgecap.workshop.data.feature_cache_reader import FeatureCache
from edgecap.workshop.data.feature_cache_store import (
    _check_same_settings,
    _exclusive,
    _prepare_dir,
    _valid_shard,
    _write_boxes,
    _write_shard,
)

if TYPE_CHECKING:
    import torch

    from edgecap.workshop.models.backbone import Backbone

__all__ = ["extract_features"]


@dataclass(frozen=True)
class _Item:
    image_id: str
    path: Path


def _dataset_items(dataset: str | os.PathLike | CaptionDataset) -> tuple[list[_Item], str, str]:
    """Images to extract (dataset order), plus a display path and name for the metadata."""
    if isinstance(dataset, (str, os.PathLike)):
        loaded, where = load_dataset(Path(dataset)), str(Path(dataset).resolve())
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


def _batches(
    items: Sequence[_Item], batch_size: int, preprocess: Callable, workers: int
) -> Generator[tuple, None, None]:
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
                yield pending[0], [cast(Future, f).result() for f in pending[1]]
            pending = future
        if pending is not None:
            yield pending[0], [cast(Future, f).result() for f in pending[1]]
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
        dataset: a dataset directory / JSON file (read with :func:`~edgecap.workshop.data.datasets.load_dataset`) or a
            :class:`~edgecap.workshop.data.datasets.CaptionDataset`.
        cache_dir: output directory (created; must be new, empty, or a cache with the same settings).
        backbone_name, image_size, weights: passed to :func:`~edgecap.workshop.models.backbone.create_backbone`.
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

    from edgecap.workshop.models.backbone import create_backbone, grid_boxes

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
