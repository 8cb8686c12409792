"""The build half of the fake ``tensorrt`` (:mod:`tests.runtime.engines.fake_trt`): ``Logger``, ``Builder``, the network
and its tensors and layers, ``OnnxParser`` and its ``ParserError``, the builder config, profiles, timing caches and
``IHostMemory``. ``build_serialized_network`` writes the JSON plan ``fake_trt_runtime`` runs."""

from __future__ import annotations

import json
from typing import Any

from tests.runtime.engines.fake_trt_base import NULL_FACTORY, ONNX_TYPES, PLAN_FORMAT, TIMING_HEADER, _Bound, check_type


class Logger(_Bound):
    def __init__(self, min_severity: Any = None) -> None:
        self.min_severity = min_severity


class Dims(tuple):
    """``trt.Dims``: a shape, -1 where dynamic (``len`` and indexing come from tuple, as the real one has them)."""


class ITensor(_Bound):
    """``_name``, ``_dtype`` (a ``DataType``), ``_shape`` (-1 where dynamic), ``_dims`` (the graph's names there)."""

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = value


class ILayer(_Bound):
    _outputs: list[ITensor]

    def get_output(self, index: int) -> ITensor | None:
        return self._outputs[index] if 0 <= index < len(self._outputs) else None


class IGatherLayer(ILayer):
    pass


def _tensor(trt: Any, name: str, dtype: Any, shape: tuple[int, ...], dims: tuple[Any, ...] | None = None) -> ITensor:
    return trt.ITensor._make(_name=name, _dtype=dtype, _shape=tuple(shape), _dims=tuple(dims or shape))


class INetworkDefinition(_Bound):
    """``_flags``, ``_strongly_typed``, ``_inputs``/``_outputs`` (ITensors), ``_gathers``, ``_source`` (the graph)."""

    def add_input(self, name: str, dtype: Any, shape: Any) -> ITensor:
        check_type(dtype, self._trt.DataType, "add_input")
        tensor = _tensor(self._trt, name, dtype, tuple(int(d) for d in shape))
        self._inputs.append(tensor)
        return tensor

    def add_gather(self, input: ITensor, indices: ITensor, axis: int) -> IGatherLayer:  # noqa: A002 - TensorRT's name
        check_type(input, ITensor, "add_gather")
        check_type(indices, ITensor, "add_gather")
        shape = list(input._shape)
        shape[axis : axis + 1] = list(indices._shape)
        out = _tensor(self._trt, f"({input.name})[gathered]", input._dtype, tuple(shape))
        self._gathers.append((input, indices, int(axis), out))
        return self._trt.IGatherLayer._make(_outputs=[out])

    def mark_output(self, tensor: ITensor) -> None:
        check_type(tensor, ITensor, "mark_output")
        self._outputs.append(tensor)


class ParserError(_Bound):
    """An error of the ONNX parser; ``str()`` modelled on the real one (node, name, operator, function, code, text).
    ``_code`` is an ``ErrorCode`` member name."""

    _code: str
    _desc: str
    _node: int = -1
    _node_name: str = ""
    _node_operator: str = ""

    def code(self) -> Any:
        return getattr(self._trt.ErrorCode, self._code)

    def desc(self) -> str:
        return self._desc

    def file(self) -> str:
        return "ModelImporter.cpp"

    def func(self) -> str:
        return "parseGraph"

    def line(self) -> int:
        return 0

    def node(self) -> int:
        return self._node

    def node_name(self) -> str:
        return self._node_name

    def node_operator(self) -> str:
        return self._node_operator

    def __str__(self) -> str:
        return (
            f"In node {self._node} with name: {self._node_name} and operator: {self._node_operator} "
            f"({self.func()}): {self._code}: {self._desc}"
        )


class OnnxParser(_Bound):
    def __init__(self, network: INetworkDefinition, logger: Logger) -> None:
        check_type(network, INetworkDefinition, "OnnxParser.__init__")
        check_type(logger, Logger, "OnnxParser.__init__")
        self._network, self._errors = network, []

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> ParserError | None:
        return self._errors[index] if 0 <= index < len(self._errors) else None

    def parse_from_file(self, model: str) -> bool:
        import onnx

        try:
            graph = onnx.load(model, load_external_data=False).graph
        except Exception as exc:  # the real parser reports any unreadable file the same way
            error = self._trt.ParserError._make(_code="MODEL_DESERIALIZE_FAILED", _desc=f"cannot read {model}: {exc}")
            self._errors.append(error)
            return False
        unsupported = self._trt._fake.unsupported_ops
        for index, node in enumerate(graph.node):
            if node.op_type in unsupported:
                desc = f"No importer registered for op: {node.op_type}"
                error = self._trt.ParserError._make(
                    _code="UNSUPPORTED_NODE", _desc=desc, _node=index, _node_name=node.name, _node_operator=node.op_type
                )
                self._errors.append(error)
        if self._errors:
            return False
        initializers = {t.name for t in graph.initializer}
        network = self._network
        network._source = model
        for value in graph.input:
            if value.name not in initializers:
                network._inputs.append(self._tensor(value))
        network._outputs.extend(self._tensor(value) for value in graph.output)
        return True

    def _tensor(self, value: Any) -> ITensor:
        tensor_type = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor_type.shape.dim)
        shape = tuple(d if isinstance(d, int) else -1 for d in dims)
        dtype = getattr(self._trt.DataType, ONNX_TYPES[tensor_type.elem_type])
        return _tensor(self._trt, value.name, dtype, shape, dims)


class IHostMemory(bytes):
    """Serialised bytes; ``bytes(plan)`` works through the buffer protocol, as on the real class."""

    _trt: Any

    @property
    def nbytes(self) -> int:
        return len(self)

    @property
    def dtype(self) -> Any:
        return self._trt.DataType.UINT8


class ITimingCache(_Bound):
    _data: bytes

    def serialize(self) -> IHostMemory:
        return self._trt.IHostMemory(self._data)


class IOptimizationProfile(_Bound):
    _shapes: dict[str, list[list[int]]]

    def set_shape(self, input: str, min: Any, opt: Any, max: Any) -> None:  # noqa: A002 - TensorRT's names
        self._shapes[input] = [[int(d) for d in s] for s in (min, opt, max)]


class IBuilderConfig(_Bound):
    _flags: list[str]
    _profiles: list[IOptimizationProfile]
    _pools: dict[str, int]
    _cache: ITimingCache | None = None

    def set_memory_pool_limit(self, pool: Any, pool_size: int) -> None:
        check_type(pool, self._trt.MemoryPoolType, "set_memory_pool_limit")
        self._pools[pool.name] = int(pool_size)

    def set_flag(self, flag: Any) -> None:
        check_type(flag, self._trt.BuilderFlag, "set_flag")
        self._flags.append(flag.name)

    def create_timing_cache(self, serialized_timing_cache: bytes) -> ITimingCache | None:
        data = bytes(serialized_timing_cache)
        if data and not data.startswith(TIMING_HEADER):
            return None  # TensorRT cannot deserialise it (it logs why)
        return self._trt.ITimingCache._make(_data=data or TIMING_HEADER + self._trt.__version__.encode() + b"\n")

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
        check_type(cache, ITimingCache, "set_timing_cache")
        own = TIMING_HEADER + self._trt.__version__.encode() + b"\n"
        if not cache._data.startswith(own) and not ignore_mismatch:
            return False  # built by another TensorRT or device
        self._cache = cache
        return True

    def get_timing_cache(self) -> ITimingCache | None:
        return self._cache

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        check_type(profile, IOptimizationProfile, "add_optimization_profile")
        self._profiles.append(profile)
        return len(self._profiles) - 1


class Builder(_Bound):
    def __init__(self, logger: Logger) -> None:
        if not self._trt._fake.cuda:
            raise TypeError(NULL_FACTORY)
        check_type(logger, Logger, "Builder.__init__")

    def create_network(self, flags: int = 0) -> INetworkDefinition | None:
        creation = self._trt.NetworkDefinitionCreationFlag
        known = sum(1 << v.value for v in creation.__members__.values())
        if int(flags) & ~known:
            return None  # TensorRT logs "invalid flags"
        strong = getattr(creation, "STRONGLY_TYPED", None)
        typed = self._trt.__version__.startswith("11.") or bool(strong is not None and flags >> strong.value & 1)
        return self._trt.INetworkDefinition._make(
            _flags=int(flags), _strongly_typed=typed, _inputs=[], _outputs=[], _gathers=[], _source=None
        )

    def create_builder_config(self) -> IBuilderConfig:
        return self._trt.IBuilderConfig._make(_flags=[], _profiles=[], _pools={})

    def create_optimization_profile(self) -> IOptimizationProfile:
        return self._trt.IOptimizationProfile._make(_shapes={})

    def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory | None:
        check_type(network, INetworkDefinition, "build_serialized_network")
        check_type(config, IBuilderConfig, "build_serialized_network")
        problem = _build_problem(network, config)
        if problem:
            self._trt._fake_log.append(problem)
            return None
        if config._cache is not None:
            config._cache._data += b"+"  # what this build timed
        plan = {
            "format": PLAN_FORMAT,
            "tensorrt": self._trt.__version__,
            "source": "gather" if network._source is None else network._source.replace("\\", "/").rsplit("/", 1)[-1],
            "graph": network._source,
            "network_flags": network._flags,
            "strongly_typed": network._strongly_typed,
            "builder_flags": config._flags,
            "workspace": config._pools.get("WORKSPACE"),
            "profiles": [p._shapes for p in config._profiles],
            "io": [_io_row(t, "INPUT") for t in network._inputs] + [_io_row(t, "OUTPUT") for t in network._outputs],
            "gathers": [[d.name, i.name, axis, o.name] for d, i, axis, o in network._gathers],
        }
        return self._trt.IHostMemory(json.dumps(plan).encode())


def _io_row(tensor: ITensor, mode: str) -> dict[str, Any]:
    return {"name": tensor.name, "mode": mode, "dtype": tensor._dtype.name, "shape": list(tensor._shape),
            "dims": list(tensor._dims)}  # fmt: skip


def _build_problem(network: INetworkDefinition, config: IBuilderConfig) -> str:
    """Why TensorRT would refuse the build ('' when it would not)."""
    if network._strongly_typed and {"FP16", "INT8", "BF16", "FP8"} & set(config._flags):
        return f"precision builder flags {config._flags} are not allowed on a strongly typed network"
    if not network._outputs:
        return "the network has no outputs"
    for tensor in network._inputs:
        if -1 not in tensor._shape:
            continue
        if not config._profiles:
            return "the network has dynamic inputs but no optimization profile"
        for profile in config._profiles:
            shapes = profile._shapes.get(tensor.name)
            if shapes is None:
                return f"input {tensor.name!r} has no shape in the optimization profile"
            for low, opt, high in zip(*shapes, strict=True):
                if not low <= opt <= high:
                    return f"input {tensor.name!r}: profile min/opt/max {shapes} disagree"
            for dims in shapes:
                if len(dims) != len(tensor._shape) or any(
                    d != s for d, s in zip(dims, tensor._shape, strict=True) if s != -1
                ):
                    return f"input {tensor.name!r}: profile shape {dims} does not fit {list(tensor._shape)}"
    return ""
