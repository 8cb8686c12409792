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

This module is where every feature-cache name is imported from. The work is split by job: the on-disk format and
errors (:mod:`~edgecap.workshop.data.feature_cache_format`), reading
(:mod:`~edgecap.workshop.data.feature_cache_reader`),
the directory on the writing side (:mod:`~edgecap.workshop.data.feature_cache_store`) and the extraction itself
(:mod:`~edgecap.workshop.data.feature_extraction`).
"""

from __future__ import annotations

from edgecap.workshop.data.feature_cache_format import (
    CACHE_FORMAT,
    CacheBusyError,
    CacheIncompleteError,
    CacheMismatchError,
    FeatureCacheError,
)
from edgecap.workshop.data.feature_cache_reader import FeatureCache
from edgecap.workshop.data.feature_extraction import extract_features

__all__ = [
    "CACHE_FORMAT",
    "CacheBusyError",
    "CacheIncompleteError",
    "CacheMismatchError",
    "FeatureCache",
    "FeatureCacheError",
    "extract_features",
]
