"""A simulated GPU for the tensorrt runtime's own logic: device memory is numpy bytes keyed by fake pointers, with the
device current in the allocating thread, and streams. The fake TensorRT's execution contexts
(:mod:`tests.runtime.engines.fake_trt_runtime`) read and write this memory; what is exercised is edgecap's side —
buffer pools,
ping-pong caches, reorder/expand on the device, tokens up and log-probs down — never CUDA itself."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import numpy as np

MEMORY: dict[int, np.ndarray] = {}
#: pointer -> the device that was current in the allocating thread (None: no cudaSetDevice in that thread)
DEVICE_OF: dict[int, int | None] = {}
#: the open streams -> the device current when each was created
STREAMS: dict[int, int | None] = {}
_NEXT = itertools.count(0x1000, 0x1000)
_CURRENT = threading.local()


def set_device(device: int) -> None:
    """``cudaSetDevice``: the calling thread's current device."""
    _CURRENT.device = int(device)


def current_device() -> int | None:
    return getattr(_CURRENT, "device", None)


class FakeStream:
    ptr = 0

    def __init__(self) -> None:
        STREAMS[id(self)] = current_device()

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        STREAMS.pop(id(self), None)


class FakeBuffer:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = int(nbytes)
        self.ptr = next(_NEXT)
        MEMORY[self.ptr] = np.zeros(max(self.nbytes, 1), np.uint8)
        DEVICE_OF[self.ptr] = current_device()

    def upload(self, array: np.ndarray, stream: Any) -> None:
        assert array.nbytes <= self.nbytes
        MEMORY[self.ptr][: array.nbytes] = np.frombuffer(np.ascontiguousarray(array).tobytes(), np.uint8)

    def download(self, out: np.ndarray, stream: Any) -> np.ndarray:
        out.reshape(-1).view(np.uint8)[:] = MEMORY[self.ptr][: out.nbytes]
        return out

    def free(self) -> None:
        MEMORY.pop(self.ptr, None)
        DEVICE_OF.pop(self.ptr, None)
        self.ptr = 0


def read(ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return MEMORY[ptr][:count].view(dtype).reshape(shape).copy()


def write(ptr: int, array: np.ndarray) -> None:
    assert array.nbytes <= MEMORY[ptr].nbytes, "an output larger than its buffer"
    MEMORY[ptr][: array.nbytes] = np.frombuffer(np.ascontiguousarray(array).tobytes(), np.uint8)
