"""The runtime half of the fake ``tensorrt`` (:mod:`tests.runtime.engines.fake_trt`): ``Runtime``, ``ICudaEngine`` and
``IExecutionContext`` running on the simulated device (:mod:`tests.runtime.engines.simulated_device`).

``Runtime.deserialize_cuda_engine`` reads the JSON plan the fake builder wrote (None for anything else, or a plan of
another TensorRT version, as TensorRT refuses those); the engine reports the plan's tensors with their
``TensorIOMode``, ``DataType`` and shapes (-1 where dynamic). A context accepts input shapes inside the profile only,
infers output shapes from the graph's dimension names, and ``execute_async_v3`` reads the bound device addresses,
runs the bundle graph the engine was built from on ONNX Runtime's CPU provider (the gather engines with
``numpy.take``) and writes the outputs back, on the device that is current, as a GPU would.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from tests.runtime.engines import simulated_device as sim
from tests.runtime.engines.fake_trt_base import NULL_FACTORY, PLAN_FORMAT, _Bound, check_type, nptype
from tests.runtime.engines.fake_trt_build import Logger

_SESSIONS: dict[tuple[str, int], Any] = {}


def _session(path: str) -> Any:
    """One ONNX Runtime CPU session per graph file (and modification time) for the whole test session."""
    import onnxruntime

    key = (path, os.stat(path).st_mtime_ns)
    if key not in _SESSIONS:
        _SESSIONS[key] = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return _SESSIONS[key]


class Runtime(_Bound):
    def __init__(self, logger: Logger) -> None:
        if not self._trt._fake.cuda:
            raise TypeError(NULL_FACTORY)
        check_type(logger, Logger, "Runtime.__init__")

    def deserialize_cuda_engine(self, serialized_engine: bytes) -> ICudaEngine | None:
        try:
            plan = json.loads(bytes(serialized_engine))
        except ValueError:
            return None  # TensorRT logs "magic tag does not match"
        if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT or plan["tensorrt"] != self._trt.__version__:
            return None
        retype = self._trt._fake.retype.get(plan["source"], {})
        io = [{**row, "dtype": retype.get(row["name"], row["dtype"])} for row in plan["io"]]
        return self._trt.ICudaEngine._make(_plan=plan, _io=io, _rows={r["name"]: r for r in io})


class ICudaEngine(_Bound):
    """``_plan`` (the fake builder's JSON), ``_io`` (its tensor rows, in binding order), ``_rows`` (by name)."""

    _plan: dict[str, Any]
    _io: list[dict[str, Any]]
    _rows: dict[str, dict[str, Any]]

    @property
    def num_io_tensors(self) -> int:
        return len(self._io)

    def get_tensor_name(self, index: int) -> str | None:
        return self._io[index]["name"] if 0 <= index < len(self._io) else None

    def get_tensor_mode(self, name: str) -> Any:
        row = self._rows.get(name)
        return getattr(self._trt.TensorIOMode, row["mode"] if row else "NONE")

    def get_tensor_dtype(self, name: str) -> Any:
        return getattr(self._trt.DataType, self._rows[name]["dtype"])

    def get_tensor_shape(self, name: str) -> Any:
        return self._trt.Dims(self._rows[name]["shape"])

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[Any]:
        return [self._trt.Dims(s) for s in self._plan["profiles"][profile_index][name]]

    def create_execution_context(self, strategy: Any = None) -> IExecutionContext | None:
        if self._trt._fake.no_context:
            return None  # TensorRT could not allocate the context's memory
        return self._trt.IExecutionContext._make(_engine=self, _shapes={}, _addresses={})


class IExecutionContext(_Bound):
    """``_engine``, ``_shapes`` (input shapes set), ``_addresses`` (tensor -> device pointer)."""

    _engine: ICudaEngine
    _shapes: dict[str, tuple[int, ...]]
    _addresses: dict[str, int]

    def set_input_shape(self, name: str, shape: Any) -> bool:
        row = self._engine._rows.get(name)
        shape = tuple(int(d) for d in shape)
        if row is None or row["mode"] != "INPUT" or len(shape) != len(row["shape"]):
            return False
        if any(fixed not in (-1, d) for fixed, d in zip(row["shape"], shape, strict=True)):
            return False
        low, _, high = self._engine._plan["profiles"][0].get(name, (shape, shape, shape))
        if not all(lo <= d <= hi for lo, d, hi in zip(low, shape, high, strict=True)):
            return False
        self._shapes[name] = shape
        return True

    def get_tensor_shape(self, name: str) -> Any:
        row = self._engine._rows[name]
        if row["mode"] == "INPUT":
            return self._trt.Dims(self._shapes.get(name, row["shape"]))
        return self._trt.Dims(self._output_shapes().get(name, row["shape"]))

    def set_tensor_address(self, name: str, memory: int) -> bool:
        if name not in self._engine._rows or name in self._trt._fake.refused_addresses or not int(memory):
            return False
        self._addresses[name] = int(memory)
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        rows = self._engine._io
        inputs = [r for r in rows if r["mode"] == "INPUT"]
        if any(r["name"] not in self._shapes for r in inputs) or any(r["name"] not in self._addresses for r in rows):
            return False  # TensorRT: a tensor without a shape or an address
        if not self._on_current_device():
            return False
        try:
            dtypes = {r["name"]: np.dtype(nptype(getattr(self._trt.DataType, r["dtype"]))) for r in rows}
        except TypeError:
            return False  # a type the simulated kernels cannot hold (BF16…)
        feed = {
            r["name"]: sim.read(self._addresses[r["name"]], self._shapes[r["name"]], dtypes[r["name"]]) for r in inputs
        }
        plan = self._engine._plan
        if plan["graph"] is None:
            results = {out: np.take(feed[data], feed[index], axis=axis) for data, index, axis, out in plan["gathers"]}
        else:
            session = _session(plan["graph"])
            names = [o.name for o in session.get_outputs()]
            results = dict(zip(names, session.run(names, feed), strict=True))
        expected = self._output_shapes()
        for row in rows:
            if row["mode"] == "OUTPUT":
                value = np.ascontiguousarray(results[row["name"]], dtype=dtypes[row["name"]])
                assert value.shape == expected[row["name"]], (row["name"], value.shape, expected[row["name"]])
                sim.write(self._addresses[row["name"]], value)
        return True

    def _on_current_device(self) -> bool:
        """Every bound address was allocated on the device current now (a kernel cannot read another's memory)."""
        current = sim.current_device()
        return all(sim.DEVICE_OF.get(ptr, current) == current for ptr in self._addresses.values())

    def _output_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each output's shape at the input shapes set, from the graph's dimension names (-1 where unknown)."""
        from edgecap.runtime.engines.profiles import ProfileError, eval_dim

        sizes: dict[str, int] = {}
        for row in self._engine._io:
            shape = self._shapes.get(row["name"])
            if row["mode"] == "INPUT" and shape is not None:
                sizes.update((d, v) for d, v in zip(row["dims"], shape, strict=True) if isinstance(d, str))
        out = {}
        gathers = {o: (data, index, axis) for data, index, axis, o in self._engine._plan["gathers"]}
        for row in self._engine._io:
            if row["mode"] != "OUTPUT":
                continue
            if row["name"] in gathers:
                data, index, axis = gathers[row["name"]]
                if data in self._shapes and index in self._shapes:
                    shape = self._shapes[data]
                    out[row["name"]] = (*shape[:axis], *self._shapes[index], *shape[axis + 1 :])
                continue
            try:
                out[row["name"]] = tuple(eval_dim(d, sizes) for d in row["dims"])
            except ProfileError:
                out[row["name"]] = tuple(row["shape"])
        return out
