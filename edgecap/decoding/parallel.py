"""Decode a batch as concurrent chunks of images, one per worker thread.

A step model may say that several decodes can run on it at once and that this pays (``decode_workers`` > 1: an
ONNX Runtime adapter on a CPU with cores to spare, ``threads="auto"``). :func:`~edgecap.decoding.decode` then
splits the images into that many contiguous chunks and decodes each in its own thread. Greedy and beam search treat
every image on its own, so the hypotheses are the ones a single decode gives; ONNX Runtime releases the GIL while a
graph runs, and each chunk's one-thread sessions work without waking a second thread for each of the step's small
kernels. Batch 16 × beam 3 on two cores: 1.3× one core's speed with two intra-op threads per call, 1.75× split
(``docs/cpu.md``).

Sampling is not split (its random draws follow the batch order), nor is mask-predict, nor a decode with caller
processors (which may hold per-call state).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from edgecap.decoding.protocol import Hypothesis

__all__ = ["SPLIT_STRATEGIES", "check_decode_workers", "decode_workers_of", "in_decode_chunk", "split_decode"]

#: Strategies whose hypotheses of an image do not depend on the other images of the batch.
SPLIT_STRATEGIES = frozenset({"greedy", "beam"})

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


def split_decode(
    decode_one: Callable[[Mapping[str, Any]], list[list[Hypothesis]]], inputs: Mapping[str, Any], workers: int
) -> list[list[Hypothesis]]:
    """``decode_one`` on ``min(workers, images)`` contiguous chunks of ``inputs`` (images on axis 0 of every
    entry), concurrently, the first in the calling thread; the hypotheses in image order."""
    images = int(next(iter(inputs.values())).shape[0])
    count = min(workers, images)
    if count < 2:
        return decode_one(inputs)
    bounds = [images * i // count for i in range(count + 1)]
    chunks = [{k: v[a:b] for k, v in inputs.items()} for a, b in zip(bounds, bounds[1:], strict=False)]

    def run(chunk: Mapping[str, Any]) -> list[list[Hypothesis]]:
        _chunk.active = True
        try:
            return decode_one(chunk)
        finally:
            _chunk.active = False

    with ThreadPoolExecutor(count - 1, thread_name_prefix="edgecap-decode") as pool:
        futures = [pool.submit(run, chunk) for chunk in chunks[1:]]
        out = run(chunks[0])
        for future in futures:
            out.extend(future.result())
    return out
