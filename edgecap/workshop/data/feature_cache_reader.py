"""Reading a complete feature cache (:class:`FeatureCache`), the feature source training uses."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.workshop.data.feature_cache_format import (
    BOXES,
    CACHE_FORMAT,
    CACHE_VERSION,
    INDEX,
    META,
    CacheIncompleteError,
    FeatureCacheError,
    _memmap_tensor,
    _read_json,
    _shard_name,
)

__all__ = ["FeatureCache"]


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
