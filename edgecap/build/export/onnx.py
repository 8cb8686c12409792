"""torch -> ONNX export driven by an :class:`~edgecap.build.export.spec.ExportSpec`.

Per graph: trace with the dynamo exporter (``dynamo=True``, ``external_data=False``, ``dynamic_shapes`` from the spec's
dims, example sizes >= 2: a size of 1 gets specialised and baked into reshapes) or compose already exported graphs; then
``onnx.checker`` + shape inference, simplification (onnxslim, or ONNX Runtime's *basic* offline optimiser, which adds no
``com.microsoft`` ops), a portability check (no ``If``/``Loop``/``Scan``, standard domain only, so the same file feeds
TensorRT), metadata (opset, edgecap version, model name, precision, graph role), the other precisions, and numeric
parity against torch on fresh inputs. Nothing here knows a model family: everything comes from the spec.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import torch
from onnx import ModelProto
from torch import nn

from edgecap._version import __version__
from edgecap.build.export.fp16 import convert_to_fp16
from edgecap.build.export.graph import (
    GraphError,
    check_model,
    compose_models,
    count_ops,
    non_portable_nodes,
    set_metadata,
)
from edgecap.build.export.spec import ExportSpec, GraphSpec, get_export_spec
from edgecap.runtime._io import atomic_write_bytes, atomic_write_json
from edgecap.runtime._renamed import renamed_value

__all__ = [
    "RENAMED_SIMPLIFIERS",
    "SIMPLIFIERS",
    "ExportError",
    "ExportResult",
    "ExportedGraph",
    "export_onnx",
    "export_graph",
    "finalize_graph",
    "simplify_model",
    "trace_graph",
]

REPORT_NAME = "export_report.json"


class ExportError(ValueError):
    """A graph that cannot be exported, validated or converted; the message names the graph and the cause."""


# -- tracing ---------------------------------------------------------------------------------------------------------
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
    model = program.model_proto
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


# -- simplification --------------------------------------------------------------------------------------------------
def _simplify_onnxslim(model: ModelProto) -> ModelProto:
    import onnxslim

    with _quiet_exporter():
        return onnxslim.slim(model)


def _simplify_onnxruntime(model: ModelProto) -> ModelProto:
    """ONNX Runtime's offline optimiser at the *basic* level: constant folding and redundant-node elimination only;
    the extended level would fuse into ``com.microsoft`` contrib ops that TensorRT cannot parse."""
    import tempfile

    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with tempfile.TemporaryDirectory() as tmp:
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


SIMPLIFIERS: dict[str, Callable[[ModelProto], ModelProto]] = {
    "onnxslim": _simplify_onnxslim,
    "onnxruntime": _simplify_onnxruntime,
    "none": lambda model: model,
}
#: Older spellings of a ``simplify`` value, still accepted with a ``FutureWarning`` ("ort" names a model family).
RENAMED_SIMPLIFIERS = {"ort": "onnxruntime"}


def simplify_model(model: ModelProto, method: str, what: str) -> ModelProto:
    """Simplify with ``method`` (a key of :data:`SIMPLIFIERS`); the interface (names, dims) is preserved."""
    method = renamed_value("simplify", method, RENAMED_SIMPLIFIERS)
    fn = SIMPLIFIERS.get(method)
    if fn is None:
        raise ExportError(f"unknown simplifier {method!r}; choose one of {sorted(SIMPLIFIERS)}")
    try:
        simplified = fn(model)
    except ImportError as exc:
        raise ExportError(
            f"{what}: simplifier {method!r} is not installed ({exc}); pip install 'edgecap[train,cpu]'"
        ) from exc
    before = ([i.name for i in model.graph.input], [o.name for o in model.graph.output])
    after = ([i.name for i in simplified.graph.input], [o.name for o in simplified.graph.output])
    if before != after:
        raise ExportError(f"{what}: simplifier {method!r} changed the graph interface {before} -> {after}")
    return simplified


# -- finishing a graph -----------------------------------------------------------------------------------------------
def finalize_graph(
    model: ModelProto,
    spec: ExportSpec,
    graph: GraphSpec,
    precision: str,
    simplify: str = "onnxslim",
    fp32: ModelProto | None = None,
) -> ModelProto:
    """Check, infer shapes, simplify (fp32) or convert the finished fp32 graph (other precisions), re-check, verify
    portability and stamp metadata; raises :class:`ExportError`.

    Args:
        model: the raw traced/composed graph.
        fp32: the finished fp32 graph, which other precisions are converted from (finished here when None).
    """
    what = f"{spec.name}/{graph.name} ({precision})"
    try:
        if precision == "fp32":
            model = check_model(simplify_model(check_model(model, what), simplify, what), what)
        else:
            base = fp32 if fp32 is not None else finalize_graph(model, spec, graph, "fp32", simplify)
            converter = PRECISION_CONVERTERS.get(precision)
            if converter is None:
                raise ExportError(f"{what}: no converter for precision {precision!r}")
            model = check_model(converter(base, graph), what)
    except GraphError as exc:
        raise ExportError(str(exc)) from exc
    bad = non_portable_nodes(model)
    if bad:
        raise ExportError(f"{what}: graph is not portable to TensorRT: {bad[:10]}")
    opset = next((imp.version for imp in model.opset_import if imp.domain in ("", "ai.onnx")), spec.opset)
    model.doc_string = graph.description
    model.producer_name, model.producer_version = "edgecap", __version__
    set_metadata(
        model,
        {
            **spec.metadata,
            "edgecap_version": __version__,
            "model_name": spec.name,
            "graph_role": graph.name,
            "precision": precision,
            "opset": opset,
            "inputs": ",".join(graph.inputs),
            "outputs": ",".join(graph.outputs),
        },
    )
    return model


PRECISION_CONVERTERS: dict[str, Callable[[ModelProto, GraphSpec], ModelProto]] = {
    "fp16": lambda model, graph: convert_to_fp16(model, graph.fp16),
}


# -- results ---------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ExportedGraph:
    """One graph at one precision.

    Attributes:
        name: graph role (``"encoder"``, ``"step"``, …).
        precision: ``"fp32"`` / ``"fp16"``.
        model: the ONNX model.
        path: where it was written (None when exported in memory).
        parity: the :func:`~edgecap.build.export.parity.check_graph` report, or None when parity was skipped.
        seconds: time spent exporting/converting this graph.
    """

    name: str
    precision: str
    model: ModelProto
    path: Path | None = None
    parity: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def serialized(self) -> bytes:
        return self.model.SerializeToString()

    def summary(self) -> dict[str, Any]:
        data = self.serialized
        return {
            "graph": self.name,
            "precision": self.precision,
            "file": self.path.name if self.path is not None else None,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "inputs": [i.name for i in self.model.graph.input],
            "outputs": [o.name for o in self.model.graph.output],
            "ops": count_ops(self.model),
            "seconds": round(self.seconds, 3),
            "parity": self.parity,
        }


@dataclasses.dataclass
class ExportResult:
    """Every exported graph, by ``(graph, precision)``, plus what a bundle manifest needs."""

    spec: ExportSpec
    graphs: dict[tuple[str, str], ExportedGraph]
    out_dir: Path | None = None

    def get(self, graph: str, precision: str = "fp32") -> ExportedGraph:
        try:
            return self.graphs[(graph, precision)]
        except KeyError:
            raise ExportError(f"no exported graph {graph!r} at {precision!r}; have {sorted(self.graphs)}") from None

    def model(self, graph: str, precision: str = "fp32") -> ModelProto:
        return self.get(graph, precision).model

    def runtime_models(self, precision: str = "fp32") -> dict[str, ModelProto]:
        """``{"encoder": init graph, "step": step graph}``: what a runtime loads (per the spec's ``runtime_graphs``)."""
        return {role: self.model(name, precision) for role, name in self.spec.runtime_graphs.items()}

    @property
    def parity_passed(self) -> bool | None:
        """True/False when every graph was checked; None when some graph was not."""
        reports = [g.parity for g in self.graphs.values()]
        if any(r is None for r in reports):
            return None
        return all(r["passed"] for r in reports)

    def report(self) -> dict[str, Any]:
        """JSON-ready summary (written as ``export_report.json``; the bundle manifest consumes it)."""
        spec = self.spec
        return {
            "model_name": spec.name,
            "edgecap_version": __version__,
            "opset": spec.opset,
            "state_names": list(spec.state_names),
            "updated_state_names": list(spec.step_state_names),
            "decode_inputs": list(spec.decode_inputs),
            "runtime_graphs": dict(spec.runtime_graphs),
            "dims": {n: {"min": d.min, "max": d.max, "example": d.example} for n, d in spec.dims.items()},
            "parity_passed": self.parity_passed,
            "graphs": [g.summary() for g in self.graphs.values()],
        }


# -- the driver ------------------------------------------------------------------------------------------------------
def export_graph(
    spec: ExportSpec, graph: GraphSpec, exported: Mapping[str, ModelProto], opset: int | None = None
) -> ModelProto:
    """The raw fp32 graph: traced, or composed from ``exported`` fp32 graphs when ``graph.compose`` is set."""
    if graph.compose:
        missing = [p for p in graph.compose if p not in exported]
        if missing:
            raise ExportError(f"graph {graph.name!r} composes {missing}, which were not exported first")
        try:
            return compose_models(
                [(p, exported[p]) for p in graph.compose], graph.inputs, graph.outputs, f"{spec.name}/{graph.name}"
            )
        except GraphError as exc:
            raise ExportError(str(exc)) from exc
    return trace_graph(spec, graph, opset)


def export_onnx(
    model: nn.Module | None = None,
    out_dir: str | Path | None = None,
    *,
    spec: ExportSpec | None = None,
    backbone: nn.Module | None = None,
    name: str | None = None,
    graphs: Sequence[str] | None = None,
    precisions: Sequence[str] | None = None,
    simplify: str = "onnxslim",
    parity: bool = True,
    parity_seed: int = 1234,
    overwrite: bool = False,
) -> ExportResult:
    """Export a model's graphs to ONNX at each precision, with parity against torch.

    Args:
        model: a ``CaptionModel``; its spec comes from :func:`~edgecap.build.export.spec.get_export_spec`. Omit when
            ``spec`` is given.
        out_dir: write ``<precision>/<graph>.onnx`` and ``export_report.json`` here (atomically); None keeps the
            graphs in memory only.
        spec: an explicit spec (overrides ``model``/``backbone``/``name``).
        backbone: include this image backbone in the encoder graph (``pixel_values`` input).
        name: model name for the graphs' metadata.
        graphs: export only these graphs (plus what they compose); default all.
        precisions: default the spec's (``fp32`` and ``fp16``); ``fp32`` is always exported (the others derive from it).
        simplify: ``"onnxslim"``, ``"onnxruntime"`` (ONNX Runtime's basic-level offline optimiser) or
            ``"none"``.
        parity: run :func:`~edgecap.build.export.parity.check_graph` on every graph (fresh inputs, per-precision
        tolerances).
        parity_seed: seed of the parity inputs (independent of the export example inputs).
        overwrite: replace existing files in ``out_dir``.

    Returns:
        An :class:`ExportResult`; a failed parity check is recorded in it (``parity_passed``), not raised, so the
        caller decides (the CLI fails, a notebook can inspect the errors).
    """
    if spec is None:
        if model is None:
            raise ExportError("export_onnx needs a model or a spec")
        model.eval()
        if backbone is not None:
            backbone.eval()
        spec = get_export_spec(model, backbone=backbone, name=name)
    for graph in spec.graphs:  # dropout off before any dummy input is computed
        graph.module.eval()
    precisions = tuple(precisions or spec.precisions)
    unknown = [p for p in precisions if p != "fp32" and p not in PRECISION_CONVERTERS]
    if unknown:
        raise ExportError(f"unknown precision(s) {unknown}; known: ['fp32', *{sorted(PRECISION_CONVERTERS)}]")
    precisions = ("fp32", *(p for p in precisions if p != "fp32"))
    simplify = renamed_value("simplify", simplify, RENAMED_SIMPLIFIERS)
    if simplify not in SIMPLIFIERS:
        raise ExportError(f"unknown simplifier {simplify!r}; choose one of {sorted(SIMPLIFIERS)}")
    selected = _with_dependencies(spec, graphs)
    if out_dir is not None:
        out_dir = Path(out_dir)
        clashes = [out_dir / p / f"{g}.onnx" for p in precisions for g in selected]
        existing = [str(p) for p in clashes if p.exists()]
        if existing and not overwrite:
            raise FileExistsError(f"export would overwrite {existing[:3]}; pass overwrite=True")

    raw: dict[str, ModelProto] = {}
    result = ExportResult(spec, {}, out_dir)
    for graph in spec.graphs:
        if graph.name not in selected:
            continue
        start = time.perf_counter()
        raw_model = export_graph(spec, graph, raw)
        raw[graph.name] = check_model(raw_model, f"{spec.name}/{graph.name}")
        traced_s = time.perf_counter() - start
        for precision in precisions:  # fp32 first: the other precisions convert the finished fp32 graph
            t0 = time.perf_counter()
            fp32 = result.graphs[(graph.name, "fp32")].model if precision != "fp32" else None
            final = finalize_graph(raw[graph.name], spec, graph, precision, simplify, fp32=fp32)
            entry = ExportedGraph(graph.name, precision, final, seconds=traced_s + time.perf_counter() - t0)
            traced_s = 0.0
            result.graphs[(graph.name, precision)] = entry
    if parity:
        from edgecap.build.export.parity import check_graph

        for entry in result.graphs.values():
            entry.parity = check_graph(spec, entry.name, entry.model, entry.precision, seed=parity_seed)
    if out_dir is not None:
        for entry in result.graphs.values():
            entry.path = out_dir / entry.precision / f"{entry.name}.onnx"
            atomic_write_bytes(entry.path, entry.serialized)
        atomic_write_json(out_dir / REPORT_NAME, result.report())
    return result


def _with_dependencies(spec: ExportSpec, graphs: Sequence[str] | None) -> set[str]:
    if graphs is None:
        return set(spec.graph_names)
    selected: set[str] = set()
    pending = list(graphs)
    while pending:
        graph = spec.graph(pending.pop())
        if graph.name not in selected:
            selected.add(graph.name)
            pending.extend(graph.compose)
    return selected
