"""The inputs and outputs of a bundle graph, with their dynamic-axis names, read without torch or TensorRT.

Export writes each dynamic dimension of a graph's inputs and outputs as an ONNX ``dim_param`` named after the export
spec's dimension (``batch``, ``past``, ``regions``, ``length``), and the manifest records each dimension's range
(``interface.dims``). Engine profiles are derived from the two. The graph is read with ``onnx`` when it is installed
(no weights are loaded; the ``tensorrt-cuNN`` extras bring it) and otherwise through an ONNX Runtime session on the
CPU, so a board that has only its onnxruntime-gpu wheel (a Jetson) can still build engines.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgecap.runtime.backends.base import TensorMeta

__all__ = ["GraphIO", "GraphReaderMissingError", "read_graph_io"]

#: What to install to read graphs: never the CPU onnxruntime, which on a GPU machine would shadow onnxruntime-gpu.
_READER_INSTALL = (
    "pip install onnx, or install edgecap with the TensorRT extra of this machine's CUDA, which brings it: "
    "'edgecap[tensorrt-cu12]' or 'edgecap[tensorrt-cu13]'"
)


class GraphReaderMissingError(ImportError):
    """Neither onnx nor onnxruntime is installed, so a graph's inputs and outputs cannot be read."""


#: ONNX ``TensorProto`` element types -> numpy dtype names.
_ONNX_ELEM = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool", 10: "float16",
              11: "float64", 16: "bfloat16"}  # fmt: skip
#: ONNX Runtime ``NodeArg.type`` strings -> numpy dtype names.
_ONNXRUNTIME_TYPES = {f"tensor({onnx_name})": name for onnx_name, name in (
    ("float", "float32"), ("float16", "float16"), ("double", "float64"), ("bfloat16", "bfloat16"), ("int64", "int64"),
    ("int32", "int32"), ("int16", "int16"), ("int8", "int8"), ("uint8", "uint8"), ("bool", "bool"))}  # fmt: skip


@dataclass(frozen=True)
class GraphIO:
    """A graph's inputs and outputs in graph order, and its ``metadata_props``."""

    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    metadata: Mapping[str, str] = field(default_factory=dict)

    def input(self, name: str) -> TensorMeta:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise KeyError(f"graph has no input {name!r} (inputs: {[s.name for s in self.inputs]})")


def read_graph_io(path: str | os.PathLike) -> GraphIO:
    """The I/O of the ONNX graph at ``path`` (``onnx`` if installed, else an ONNX Runtime CPU session).

    Raises:
        GraphReaderMissingError: neither onnx nor onnxruntime is installed.
        ValueError: a dynamic dimension has no name (the graph was not written by edgecap's export).
    """
    path = Path(path)
    try:
        import onnx
    except ImportError:
        io = _read_with_onnxruntime(path)
    else:
        io = _read_with_onnx(onnx, path)
    for spec in (*io.inputs, *io.outputs):
        if any(d == "" for d in spec.shape):
            raise ValueError(f"{path.name}: tensor {spec.name!r} has an unnamed dynamic dimension {spec.shape}")
    return io


def _read_with_onnx(onnx: Any, path: Path) -> GraphIO:
    model = onnx.load(os.fspath(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}

    def spec(value: Any) -> TensorMeta:
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim)
        return TensorMeta(value.name, _ONNX_ELEM.get(tensor.elem_type, f"onnx:{tensor.elem_type}"), dims)

    inputs = tuple(spec(v) for v in model.graph.input if v.name not in initializers)
    outputs = tuple(spec(v) for v in model.graph.output)
    return GraphIO(inputs, outputs, {p.key: p.value for p in model.metadata_props})


def _read_with_onnxruntime(path: Path) -> GraphIO:
    try:
        import onnxruntime
    except ImportError:
        raise GraphReaderMissingError(
            f"reading the inputs and outputs of {path.name} needs onnx (or an onnxruntime already installed): "
            f"{_READER_INSTALL}"
        ) from None
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])

    def spec(arg: Any) -> TensorMeta:
        dims = tuple(d if isinstance(d, (int, str)) else "" for d in arg.shape)
        return TensorMeta(arg.name, _ONNXRUNTIME_TYPES.get(arg.type, arg.type), dims)

    meta = dict(session.get_modelmeta().custom_metadata_map)
    return GraphIO(tuple(map(spec, session.get_inputs())), tuple(map(spec, session.get_outputs())), meta)
