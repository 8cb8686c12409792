"""Decode a batch as concurrent chunks of images, one per worker thread.

A step model may say that several decodes can run on it at once and that this pays (``decode_workers`` > 1: an
ONNX Runtime adapter on a CPU with cores to spare, ``threads="auto"``). :func:`~edgecap.runtime.decoding.decode` then
splits the images into that many contiguous chunks and decodes each in its own thread. Greedy and beam search treat
every image on its own, so the hypotheses are the ones a single decode gives; ONNX Runtime releases the GIL while a
graph runs, and each chunk's one-thread sessions work without waking a second thread for each of the step's small
kernels. Batch 16 × beam 3 on two cores: 1.3× one core's speed with two intra-op threads per call, 1.75× split
(``docs/cpu.md``).

Sampling is not split (its random draws follow the batch order), nor is mask-predict, nor a decode with caller
processors (which may hold per-call state).

A step model whose graph rows are not independent (``rows_independent`` False: a ``dynamic`` INT8 step quantises a
call's activations with one scale over all its rows) would give an image another caption in another batch, or in
another chunk of a split batch. Its greedy, beam and mask-predict decodes run image by image instead (each image's
hypotheses together, never with another image's rows), ``decode_workers`` images at once; a caption then never
depends on which other images share its batch, at the cost of batching (docs/int8.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from edgecap.runtime.decoding.protocol import Hypothesis

__all__ = [
    "PER_IMAGE_STRATEGIES",
    "SPLIT_STRATEGIES",
    "check_decode_workers",
    "decode_workers_of",
    "in_decode_chunk",
    "rows_independent_of",
    "split_decode",
]

#: Strategies whose hypotheses of an image do not depend on the other images of the batch.
SPLIT_STRATEGIES = frozenset({"greedy", "beam"})
#: Strategies decoded image by image on a model whose rows are not independent (sampling's draws follow the batch).
PER_IMAGE_STRATEGIES = frozenset({"greedy", "beam", "mask_predict"})

_chunk = threading.local()


def in_decode_chunk() -> bool:
    """Whether this thread is decoding one chunk of a split batch (its calls then stay on one-thread sessions)."""
    return bool(getattr(_chunk, "active", False))


def check_decode_workers(workers: Any) -> int:
    """``workers`` when it is an integer >= 1, else a ``ValueError`` that says so."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"decode_workers must be an integer >= 1, got {workers!r}")
    return workers


def decode_workers_of(step_model: Any) -> int:
    """The chunks a decode on ``step_model`` may run at once: its ``decode_workers``, 1 when it has none."""
    return check_decode_workers(getattr(step_model, "decode_workers", 1))


def rows_independent_of(model: Any) -> bool:
    """Whether ``model``'s graph computes each row of a call on its own (its ``rows_independent``; True when it has
    none: float graphs and static INT8 ones do)."""
    return bool(getattr(model, "rows_independent", True))


def split_decode(
    decode_one: Callable[[Mapping[str, Any]], list[list[Hypothesis]]],
    inputs: Mapping[str, Any],
    workers: int,
    *,
    per_image: bool = False,
) -> list[list[Hypothesis]]:
    """``decode_one`` on ``min(workers, images)`` contiguous chunks of ``inputs`` (images on axis 0 of every
    entry), concurrently, the first in the calling thread; the hypotheses in image order. ``per_image``: one chunk
    per image instead, ``workers`` of them at once (for a model whose rows are not independent)."""
    images = int(next(iter(inputs.values())).shape[0])
    count = min(workers, images)
    if per_image:
        chunks = [{k: v[i : i + 1] for k, v in inputs.items()} for i in range(images)]
        if count < 2:
            return [hyps for chunk in chunks for hyps in _in_chunk(decode_one, chunk)]
        with ThreadPoolExecutor(count, thread_name_prefix="edgecap-decode") as pool:
            return [hyps for found in pool.map(lambda c: _in_chunk(decode_one, c), chunks) for hyps in found]
    if count < 2:
        return decode_one(inputs)
    bounds = [images * i // count for i in range(count + 1)]
    chunks = [{k: v[a:b] for k, v in inputs.items()} for a, b in zip(bounds, bounds[1:], strict=False)]

    def run(chunk: Mapping[str, Any]) -> list[list[Hypothesis]]:
        return _in_chunk(decode_one, chunk)

    with ThreadPoolExecutor(count - 1, thread_name_prefix="edgecap-decode") as pool:
        futures = [pool.submit(run, chunk) for chunk in chunks[1:]]
        out = run(chunks[0])
        for future in futures:
            out.extend(future.result())
    return out


def _in_chunk(
    decode_one: Callable[[Mapping[str, Any]], list[list[Hypothesis]]], chunk: Mapping[str, Any]
) -> list[list[Hypothesis]]:
    """``decode_one(chunk)`` with this thread marked as decoding a chunk (no nested split, one-thread sessions)."""
    _chunk.active = True
    try:
        return decode_one(chunk)
    finally:
        _chunk.active = False
