"""Tracing one graph of an :class:`~edgecap.workshop.export.spec.ExportSpec` to ONNX with torch's dynamo exporter.

``dynamo=True``, ``external_data=False``, ``dynamic_shapes`` from the spec's dims at example sizes >= 2 (a size of 1
gets specialised and baked into reshapes); the exporter's chatter is silenced and the graph's dim names made the
spec's, which runtimes and TensorRT profiles read.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from typing import cast

import torch
from onnx import ModelProto
from torch import nn

from edgecap.workshop.export.results import ExportError
from edgecap.workshop.export.spec import ExportSpec, GraphSpec


class _Positional(nn.Module):
    """``forward(*inputs)``: one signature for every graph, so ``dynamic_shapes`` is a tuple in input order."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.part = module

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.part(*inputs))


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[io.StringIO]:
    """Silence the dynamo exporter's progress lines and deprecation chatter; yield what it printed."""
    buffer = io.StringIO()
    loggers = [
        logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "torch.__trace", "onnxscript")
    ]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(buffer):
            warnings.simplefilter("ignore")
            yield buffer
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def trace_graph(spec: ExportSpec, graph: GraphSpec, opset: int | None = None) -> ModelProto:
    """Export ``graph.module`` with the dynamo exporter at the spec's example sizes (raw, not yet checked)."""
    sizes = spec.example_sizes()
    example = graph.make_inputs(sizes, torch.Generator().manual_seed(0))
    missing = [n for n in graph.inputs if n not in example]
    if missing:
        raise ExportError(f"graph {graph.name!r}: make_inputs() did not produce input(s) {missing}")
    args = tuple(example[n] for n in graph.inputs)
    dims = {name: torch.export.Dim(name, min=dim.min, max=dim.max) for name, dim in spec.dims.items() if dim.is_dynamic}
    per_input = tuple(
        {axis: dims[d] for axis, d in graph.dynamic_axes.get(n, {}).items() if d in dims} or None for n in graph.inputs
    )
    with _quiet_exporter() as printed:
        try:
            program = torch.onnx.export(
                _Positional(graph.module).eval(),
                args,
                dynamo=True,
                external_data=False,
                opset_version=opset or spec.opset,
                input_names=list(graph.inputs),
                output_names=list(graph.outputs),
                dynamic_shapes=(per_input,),
                optimize=True,  # without it, a passed-through input is renamed to its output name
                verbose=False,
            )
        except Exception as exc:  # the exporter raises many unrelated types; report them uniformly
            tail = printed.getvalue()[-2000:]
            raise ExportError(f"graph {graph.name!r}: torch.onnx.export failed: {exc}\n{tail}") from exc
    model = cast("torch.onnx.ONNXProgram", program).model_proto  # the dynamo exporter always returns one
    names = ([i.name for i in model.graph.input], [o.name for o in model.graph.output])
    if names != (list(graph.inputs), list(graph.outputs)):
        raise ExportError(
            f"graph {graph.name!r}: the exporter produced inputs/outputs {names}, "
            f"the spec declares {(list(graph.inputs), list(graph.outputs))}"
        )
    _name_dynamic_dims(model, graph)
    return model


def _name_dynamic_dims(model: ModelProto, graph: GraphSpec) -> None:
    """Make input/output dim names exactly the spec's (the exporter may write ``s0`` or ``past + 1``-style names for
    outputs); runtimes and TensorRT profiles read these names."""
    for vi in (*model.graph.input, *model.graph.output):
        axes = graph.dynamic_axes.get(vi.name, {})
        dims = vi.type.tensor_type.shape.dim
        for axis, name in axes.items():
            if axis < len(dims) and not dims[axis].HasField("dim_value"):
                dims[axis].dim_param = name
