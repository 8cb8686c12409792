"""The engine side of the ``tensorrt`` runtime: deserialised engines, per-thread workers (execution contexts, a
stream, buffer pools) and the launch of one engine; :mod:`edgecap.runtime.backends.tensorrt.runtime` drives them from
the search.

Every TensorRT call of the runtime is here. Each result TensorRT reports by value is checked: a NULL ``Runtime``
(CUDA could not start), an engine that does not deserialise, a context it cannot create (``None``), an input shape
outside the profile or an address it refuses (``False``), a launch that fails. Data types go through edgecap's table
(:func:`~edgecap.runtime.engines.tensorrt_api.numpy_dtype`), so an engine with a bfloat16 or FP8 input or output is
refused
by name when loaded instead of failing inside ``trt.nptype``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.runtime.backends.base import TensorMeta
from edgecap.runtime.engines.buffers import BufferPlan
from edgecap.runtime.engines.graphs import GraphIO

log = logging.getLogger(__name__)

__all__ = ["MAX_POOLS", "DeviceTensor", "TrtEngineError"]

#: Buffer pools (one per batch shape) a thread's worker keeps; the least recently used beyond this are freed.
MAX_POOLS = 4


class TrtEngineError(RuntimeError):
    """An engine that cannot be deserialised or run with the shapes asked for; the message says what to rebuild."""


@dataclass
class DeviceTensor:
    """A state tensor on the device: copy ``copy`` of buffer ``name`` of a pool, holding ``shape`` densely.

    ``origin`` (carried states only): for each row, the row of the encoder output it copies, so a reorder that leaves
    every row's content unchanged skips the gather (see :meth:`TrtStepModel.select`).
    """

    pool: _Pool
    name: str
    copy: int
    shape: tuple[int, ...]
    origin: tuple[int, ...] | None = None

    @property
    def ptr(self) -> int:
        return self.pool.ptr(self.name, self.copy)


def _io_from_record(entry: Mapping[str, Any], dtypes: Mapping[str, np.dtype]) -> GraphIO:
    """A graph's I/O as recorded at build time, with each tensor's dtype as the engine binds it."""

    def specs(rows: Sequence[Mapping[str, Any]]) -> tuple[TensorMeta, ...]:
        return tuple(
            TensorMeta(r["name"], dtypes[r["name"]].name if r["name"] in dtypes else r["dtype"], tuple(r["shape"]))
            for r in rows
        )

    return GraphIO(specs(entry["io"]["inputs"]), specs(entry["io"]["outputs"]))


class _Engine:
    """A deserialised engine: its I/O names and numpy dtypes; contexts are made per thread."""

    def __init__(self, trt: Any, runtime: Any, plan: bytes, name: str) -> None:
        from edgecap.runtime.engines.tensorrt_api import NUMPY_DTYPES, numpy_dtype

        self.name = name
        self.engine = runtime.deserialize_cuda_engine(plan)
        if self.engine is None:
            raise TrtEngineError(f"TensorRT could not deserialise the {name} engine; rebuild it with edgecap engine")
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.dtypes: dict[str, np.dtype] = {}
        for i in range(self.engine.num_io_tensors):
            tensor = self.engine.get_tensor_name(i)
            is_input = self.engine.get_tensor_mode(tensor) == trt.TensorIOMode.INPUT
            (self.inputs if is_input else self.outputs).append(tensor)
            data_type = self.engine.get_tensor_dtype(tensor)
            dtype = numpy_dtype(data_type)
            if dtype is None:
                raise TrtEngineError(
                    f"the {name} engine's {'input' if is_input else 'output'} {tensor!r} is "
                    f"{getattr(data_type, 'name', data_type)}, which no numpy array holds (edgecap passes every "
                    f"engine input and output through one: {sorted(NUMPY_DTYPES)}); rebuild the engines with edgecap "
                    "engine from fp32, fp16 or int8 graphs"
                )
            self.dtypes[tensor] = dtype

    def context(self) -> Any:
        """A new execution context (one per thread).

        Raises:
            TrtEngineError: TensorRT returned none (typically out of device memory for the activations).
        """
        context = self.engine.create_execution_context()
        if context is None:
            raise TrtEngineError(
                f"TensorRT could not create an execution context for the {self.name} engine (out of device memory? "
                "see the TensorRT log); free GPU memory or rebuild with a smaller --max-batch"
            )
        return context


def _launch(
    engine: _Engine,
    context: Any,
    inputs: Mapping[str, tuple[int, tuple[int, ...]]],
    outputs: Mapping[str, int],
    stream: Any,
) -> dict[str, tuple[int, ...]]:
    """Bind ``inputs`` (name -> (device pointer, shape)) and ``outputs`` (name -> pointer), launch on ``stream``;
    returns each output's shape."""
    for name, (ptr, shape) in inputs.items():
        if not context.set_input_shape(name, shape):
            raise TrtEngineError(
                f"{engine.name} engine: input {name!r} of shape {shape} is outside its optimisation profile; rebuild "
                "with a larger --max-batch/--beam (edgecap engine --rebuild)"
            )
        _bind(engine, context, name, ptr)
    shapes = {}
    for name, ptr in outputs.items():
        shapes[name] = tuple(int(d) for d in context.get_tensor_shape(name))
        _bind(engine, context, name, ptr)
    if not context.execute_async_v3(stream.ptr):
        raise TrtEngineError(f"{engine.name} engine: execute_async_v3 failed (see the TensorRT log)")
    return shapes


def _bind(engine: _Engine, context: Any, name: str, ptr: int) -> None:
    """``set_tensor_address``, whose False (a name the engine lacks, a misaligned or NULL address) would otherwise
    surface only as a failed launch."""
    if not context.set_tensor_address(name, ptr):
        raise TrtEngineError(
            f"{engine.name} engine: TensorRT refused the device address {ptr:#x} of tensor {name!r} (see the TensorRT "
            "log); the engine and the bundle's interface disagree, rebuild the engines with edgecap engine --rebuild"
        )


class _Pool:
    """The device buffers of one batch shape (:func:`~edgecap.runtime.engines.buffers.plan_buffers`), allocated once."""

    def __init__(self, plan: BufferPlan) -> None:
        from edgecap.runtime.engines.cuda import DeviceBuffer

        self.plan = plan
        self._buffers: dict[str, list[Any]] = {}
        try:
            for spec in plan.buffers:
                self._buffers[spec.name] = [DeviceBuffer(spec.nbytes) for _ in range(spec.copies)]
        except BaseException:
            self.free()
            raise

    def ptr(self, name: str, copy: int = 0) -> int:
        return self._buffers[name][copy].ptr

    def buffer(self, name: str, copy: int = 0) -> Any:
        return self._buffers[name][copy]

    def free(self) -> None:
        for copies in self._buffers.values():
            for buffer in copies:
                buffer.free()
        self._buffers.clear()


def _use_device(device: int) -> None:
    """Make ``device`` current in the calling thread (through the module, so the tests' simulated device applies)."""
    from edgecap.runtime.engines import cuda

    cuda.set_device(device)


class _Worker:
    """One thread's execution contexts, stream and buffer pools (at most :data:`MAX_POOLS`, least recently used
    freed first), all on ``device``."""

    def __init__(self, engines: Mapping[str, _Engine], device: int) -> None:
        from edgecap.runtime.engines.cuda import Stream

        self.device = device
        _use_device(device)
        self.stream = Stream()
        self.contexts = {role: engine.context() for role, engine in engines.items()}
        self.pools: OrderedDict[int, _Pool] = OrderedDict()

    def pool(self, images: int) -> _Pool | None:
        pool = self.pools.get(images)
        if pool is not None:
            self.pools.move_to_end(images)
        return pool

    def add_pool(self, images: int, pool: _Pool) -> None:
        self.pools[images] = pool
        while len(self.pools) > MAX_POOLS:
            _, evicted = self.pools.popitem(last=False)
            evicted.free()

    def close(self) -> None:
        _use_device(self.device)
        for pool in self.pools.values():
            pool.free()
        self.pools.clear()
        self.contexts.clear()
        self.stream.close()


class _ThreadToken:
    """Held only by one thread's ``threading.local``: CPython drops it when the thread ends, and its finalizer
    releases that thread's worker."""

    __slots__ = ("__weakref__", "worker")

    def __init__(self, worker: _Worker) -> None:
        self.worker = worker


class _EngineSet:
    """The engines of one set and the per-thread workers that run them; a context manager."""

    def __init__(self, folder: Path, record: Mapping[str, Any], roles: Sequence[str], device: int = 0) -> None:
        self.folder, self.record, self.roles, self.device = folder, record, tuple(roles), device
        self.engines: dict[str, _Engine] = {}
        self._local = threading.local()
        self._workers: dict[_Worker, weakref.finalize] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> _EngineSet:
        """Deserialise the engines.

        Raises:
            EngineUnavailableError: TensorRT could not start CUDA.
            TrtEngineError: an engine does not deserialise, or has a type edgecap cannot hand over.
        """
        from edgecap.runtime.engines.store import engine_file
        from edgecap.runtime.engines.tensorrt_api import load_tensorrt, start

        trt = load_tensorrt()
        _use_device(self.device)  # the engines' weights are deserialised onto the current device
        runtime = start(trt, "Runtime")
        entries = {**self.record["engines"], **self.record.get("gathers", {})}
        for role in self.roles:
            plan = engine_file(self.folder, entries[role]["plan"], "plan").read_bytes()  # inside the bundle only
            self.engines[role] = _Engine(trt, runtime, plan, role)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            workers = list(self._workers.items())
            self._workers.clear()
        for worker, finalizer in workers:
            finalizer.detach()
            worker.close()
        self._local = threading.local()
        self.engines.clear()

    def worker(self) -> _Worker:
        """The calling thread's worker (made on first use), with the engines' device made current."""
        token = getattr(self._local, "token", None)
        if token is None:
            if not self.engines:
                raise TrtEngineError("the TensorRT engines are closed (use the model inside its with-block)")
            worker = _Worker(self.engines, self.device)
            token = self._local.token = _ThreadToken(worker)
            finalizer = weakref.finalize(token, self._release, worker)
            finalizer.atexit = False  # at interpreter exit the process's device memory goes with it; no CUDA calls
            with self._lock:
                self._workers[worker] = finalizer
        else:
            _use_device(self.device)  # another engine set may have made another device current in this thread
        return token.worker

    def workers(self) -> int:
        """How many threads' workers are alive (each holds a stream, contexts and buffers)."""
        with self._lock:
            return len(self._workers)

    def _release(self, worker: _Worker) -> None:
        """A thread ended: free its worker (called by the finalizer of its token, in that thread)."""
        with self._lock:
            if self._workers.pop(worker, None) is None:
                return
        try:
            worker.close()
        except Exception:  # a finalizer must not raise; the memory is lost either way
            log.exception("tensorrt: could not release a finished thread's device buffers")

    def io(self, role: str) -> GraphIO:
        return _io_from_record(self.record["engines"][role], self.engines[role].dtypes)

    def max_sizes(self, role: str) -> dict[str, int]:
        dims = self.record["engines"][role]["profile"]["dims"]
        return {n: int(r[2]) for n, r in dims.items() if n != "batch"}

    def max_rows(self, role: str) -> int:
        return int(self.record["engines"][role]["profile"]["dims"]["batch"][2])
