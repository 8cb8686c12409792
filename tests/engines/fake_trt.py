"""A stand-in for the ``tensorrt`` module's build API that records what edgecap asks of it: the "plan" it returns
is the JSON of the network flags, builder flags, workspace and profile shapes, so tests read back every decision.
It checks nothing TensorRT checks; it is here to test edgecap's side of the build, never TensorRT."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any


class _Logger:
    WARNING = 2

    def __init__(self, level: int) -> None:
        self.level = level


class _Tensor:
    def __init__(self, name: str, dtype: Any = None, shape: Any = None) -> None:
        self.name, self.dtype, self.shape = name, dtype, shape


class _Network:
    def __init__(self, flags: int) -> None:
        self.flags, self.inputs, self.outputs, self.gathers, self.parsed = flags, [], [], [], None

    def add_input(self, name: str, dtype: Any, shape: Any) -> _Tensor:
        self.inputs.append([name, str(dtype), list(shape)])
        return _Tensor(name, dtype, shape)

    def add_gather(self, data: _Tensor, index: _Tensor, axis: int) -> Any:
        self.gathers.append([data.name, index.name, axis])
        out = _Tensor(f"gather({data.name})")
        return SimpleNamespace(get_output=lambda i: out)

    def mark_output(self, tensor: _Tensor) -> None:
        self.outputs.append(tensor.name)


class _Profile:
    def __init__(self) -> None:
        self.shapes: dict[str, list[list[int]]] = {}

    def set_shape(self, name: str, low: Any, opt: Any, high: Any) -> None:
        self.shapes[name] = [list(low), list(opt), list(high)]


class _Cache:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def serialize(self) -> bytes:
        return self.data + b"+"


class _Config:
    def __init__(self) -> None:
        self.flags, self.profiles, self.workspace, self.cache = [], [], None, None

    def set_memory_pool_limit(self, pool: Any, size: int) -> None:
        self.workspace = size

    def set_flag(self, flag: Any) -> None:
        self.flags.append(flag)

    def create_timing_cache(self, data: bytes) -> _Cache:
        return _Cache(bytes(data))

    def set_timing_cache(self, cache: _Cache, ignore_mismatch: bool) -> bool:
        self.cache = cache
        return True

    def get_timing_cache(self) -> _Cache:
        return self.cache

    def add_optimization_profile(self, profile: _Profile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1


class _Builder:
    def __init__(self, logger: Any) -> None:
        self.logger = logger

    def create_network(self, flags: int) -> _Network:
        return _Network(flags)

    def create_builder_config(self) -> _Config:
        return _Config()

    def create_optimization_profile(self) -> _Profile:
        return _Profile()

    def build_serialized_network(self, network: _Network, config: _Config) -> bytes:
        return json.dumps(
            {
                "network_flags": network.flags,
                "parsed": network.parsed,
                "inputs": network.inputs,
                "gathers": network.gathers,
                "outputs": network.outputs,
                "builder_flags": config.flags,
                "workspace": config.workspace,
                "profiles": [p.shapes for p in config.profiles],
                "timing_cache": config.cache.data.decode() if config.cache else None,
            }
        ).encode()


class _Parser:
    def __init__(self, network: _Network, logger: Any) -> None:
        self.network, self.num_errors = network, 0

    def parse_from_file(self, path: str) -> bool:
        self.network.parsed = path.rsplit("/", 1)[-1]
        return True


def fake_tensorrt(version: str = "10.3.0.30") -> Any:
    """The stand-in module; ``version`` 11.x drops the weak-typing builder flags, as TensorRT 11 does."""
    weak = SimpleNamespace(FP16="FP16", INT8="INT8") if not version.startswith("11") else SimpleNamespace()
    return SimpleNamespace(
        __version__=version,
        Logger=_Logger,
        Builder=_Builder,
        OnnxParser=_Parser,
        NetworkDefinitionCreationFlag=SimpleNamespace(STRONGLY_TYPED=0),
        BuilderFlag=weak,
        MemoryPoolType=SimpleNamespace(WORKSPACE="WORKSPACE"),
        **{t: t for t in ("float32", "float16", "bfloat16", "int32", "int64", "int8", "uint8", "bool")},
    )
