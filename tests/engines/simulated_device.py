"""A simulated GPU for the tensorrt runtime's own logic: device memory is numpy bytes keyed by fake pointers, and
each "engine" runs the bundle graph it was built from on ONNX Runtime (the gathers with ``numpy.take``). What is
exercised is edgecap's side — buffer pools, ping-pong caches, reorder/expand on the device, tokens up and log-probs
down — never TensorRT or CUDA themselves."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from pathlib import Path
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


class FakeEngine:
    """Inputs, outputs and dtypes as a TensorRT engine of the graph reports them; runs through ``fn``."""

    def __init__(self, name: str, inputs: list[str], outputs: list[str], dtypes: Mapping[str, Any], fn: Any) -> None:
        self.name, self.inputs, self.outputs, self.fn = name, inputs, outputs, fn
        self.dtypes = {n: np.dtype(d) for n, d in dtypes.items()}

    def context(self) -> str:
        return f"{self.name}@cuda:{current_device()}"


def fake_launch(engine: FakeEngine, context: Any, inputs: Mapping, outputs: Mapping, stream: Any) -> dict:
    feed = {n: read(ptr, tuple(shape), engine.dtypes[n]) for n, (ptr, shape) in inputs.items()}
    results = engine.fn(feed)
    shapes = {}
    for name, ptr in outputs.items():
        value = np.ascontiguousarray(results[name], dtype=engine.dtypes[name])
        write(ptr, value)
        shapes[name] = value.shape
    return shapes


def engines_from_record(folder: Path, record: Mapping[str, Any], bundle_path: Path, roles: Any) -> dict:
    """Per role a :class:`FakeEngine` over the graph the record says it was built from (ORT on the CPU)."""
    import onnxruntime as ort

    out = {}
    for role in roles:
        if role in record["engines"]:
            entry = record["engines"][role]
            session = ort.InferenceSession(str(bundle_path / entry["graph"]), providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            io = entry["io"]
            dtypes = {t["name"]: t["dtype"] for t in (*io["inputs"], *io["outputs"])}

            def run(feed: dict, session: Any = session, names: list = names) -> dict:
                return dict(zip(names, session.run(names, feed), strict=True))

            inputs = [t["name"] for t in io["inputs"]]
            out[role] = FakeEngine(role, inputs, names, dtypes, run)
        else:
            states = record["gathers"][role]["states"]
            step_io = record["engines"]["step"]["io"]["inputs"]
            dtypes = {t["name"]: t["dtype"] for t in step_io if t["name"] in states}
            dtypes.update({f"{n}_gathered": dtypes[n] for n in states}, index="int32")

            def gather(feed: dict, states: list = states) -> dict:
                return {f"{n}_gathered": np.take(feed[n], feed["index"], axis=0) for n in states}

            out[role] = FakeEngine(role, ["index", *states], [f"{n}_gathered" for n in states], dtypes, gather)
    return out
