"""``ExportSpec``: what a model family declares once so that export, parity checks and runtimes never branch on it.

Modelled on optimum's ``OnnxConfig``: one frozen spec per model lists its
graphs; per graph the input/output names, the dynamic axes, a dummy-input function and the tolerances per precision;
plus the dimension ranges, the opset and the graphs a runtime loads. ``edgecap.workshop.export.onnx`` and
``edgecap.workshop.export.parity`` read only the spec.

A family names its builder in its ``FamilyHooks.export_spec``; :func:`get_export_spec` finds it from the model's
``cfg.family`` (a registry lookup, not an ``if`` chain), so a new family is one module plus its registration.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from edgecap.runtime.backends.roles import DECODING_ROLES
from edgecap.runtime.precisions import FLOAT_PRECISIONS

__all__ = [
    "DECODING_ROLES",
    "DEFAULT_OPSET",
    "PRECISIONS",
    "DimSpec",
    "ExportSpec",
    "ExportSpecError",
    "Fp16Policy",
    "GraphSpec",
    "InputMaker",
    "Tolerance",
    "get_export_spec",
    "list_export_families",
]

#: The dynamo exporter's native opset (torch 2.13+); LayerNormalization needs >= 17.
DEFAULT_OPSET = 20
#: Precisions an ONNX graph can be written in (the converters live in ``edgecap.workshop.export.finishing``); INT8 is
#: made from the FP32 graph by ``edgecap.workshop.export.calibration``.
PRECISIONS = FLOAT_PRECISIONS

#: ``make_inputs(sizes, generator) -> {input name: tensor}`` for one graph; ``sizes`` maps dim names to sizes.
InputMaker = Callable[[Mapping[str, int], torch.Generator], dict[str, torch.Tensor]]


class ExportSpecError(ValueError):
    """An export spec that is inconsistent, or a model without a registered spec; the message names the field."""


@dataclass(frozen=True)
class Tolerance:
    """Element-wise parity bound, numpy ``allclose`` style: ``|actual - expected| <= atol + rtol * |expected|``.

    Polygraphy's ``--atol/--rtol`` with ``--check-error-stat elemwise``; the strictest of its statistics.
    """

    atol: float
    rtol: float = 0.0

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ExportSpecError(f"Tolerance.{name} must be a finite number >= 0, got {value!r}")

    def to_dict(self) -> dict[str, float]:
        return {"atol": float(self.atol), "rtol": float(self.rtol)}


@dataclass(frozen=True)
class DimSpec:
    """A named dynamic dimension: its range (what an engine profile covers) and the size export traces with.

    ``example`` must not be 0 or 1: the dynamo exporter specialises a dimension whose example size is 0/1 and bakes
    that size into reshapes, so ONNX Runtime rejects any other size. A dimension with ``min == max`` is static
    and needs no example rule.
    """

    name: str
    min: int
    max: int
    example: int

    def __post_init__(self) -> None:
        if not 0 <= self.min <= self.max:
            raise ExportSpecError(f"dim {self.name!r}: need 0 <= min <= max, got min={self.min}, max={self.max}")
        if not self.min <= self.example <= self.max:
            raise ExportSpecError(f"dim {self.name!r}: example {self.example} outside [{self.min}, {self.max}]")
        if self.is_dynamic and self.example < 2:
            raise ExportSpecError(
                f"dim {self.name!r}: example size {self.example} would be specialised by the exporter; use >= 2"
            )

    @property
    def is_dynamic(self) -> bool:
        return self.min != self.max

    def check(self, size: int, where: str) -> None:
        if not self.min <= size <= self.max:
            raise ExportSpecError(f"{where}: size {size} of dim {self.name!r} is outside [{self.min}, {self.max}]")


@dataclass(frozen=True)
class Fp16Policy:
    """Which parts of a graph stay float32 when the rest is converted to float16 (inputs/outputs stay float32).

    Attributes:
        op_types: op types always kept in float32 (``op_block_list`` of onnxconverter-common): normalisation
            statistics, softmax, exp/log and anything with a large dynamic range.
        fp32_input_cones: graph inputs whose forward cone stays float32 up to (not including) the first op in
            ``cone_stops``.
        fp32_ancestors_of: op types whose whole input computation stays float32, back to graph inputs, constants or
            an op in ``cone_stops`` — e.g. ``Sin``/``Cos`` of a sinusoidal box embedding, whose angles reach ~700 rad
            (float16's resolution there is 0.5 rad), whether the boxes are a graph input or a constant grid.
        cone_stops: op types that end a float32 cone (learned projections); ``Shape`` never propagates a cone.
    """

    op_types: tuple[str, ...] = ()
    fp32_input_cones: tuple[str, ...] = ()
    fp32_ancestors_of: tuple[str, ...] = ()
    cone_stops: tuple[str, ...] = ("MatMul", "Gemm", "Conv")


@dataclass(frozen=True, eq=False)
class GraphSpec:
    """One exportable part of a model.

    Attributes:
        name: the graph's role and file stem (``"encoder"``, ``"start"``, ``"step"``, ``"init"``).
        module: called positionally with the inputs in ``inputs`` order; returns a tuple in ``outputs`` order.
            It is the torch reference of parity checks and, unless ``compose`` is set, what export traces.
        inputs, outputs: graph tensor names (fixed and documented: they are the runtime interface).
        dynamic_axes: tensor name -> {axis: dim name}; the dim names are keys of :attr:`ExportSpec.dims`.
        make_inputs: dummy-input function, called with the example sizes for export and with fresh sizes (and a
            fresh seed) for parity.
        tolerances: precision -> default :class:`Tolerance` of every output.
        output_tolerances: precision -> {output: :class:`Tolerance`} overrides.
        compose: build this graph by wiring already exported graphs in this order (outputs and inputs matched by
            name) instead of tracing ``module``; ``module`` must compute the same function.
        fp16: the :class:`Fp16Policy` of this graph.
        description: one line for reports.
    """

    name: str
    module: nn.Module
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dynamic_axes: Mapping[str, Mapping[int, str]]
    make_inputs: InputMaker
    tolerances: Mapping[str, Tolerance]
    output_tolerances: Mapping[str, Mapping[str, Tolerance]] = field(default_factory=dict)
    compose: tuple[str, ...] = ()
    fp16: Fp16Policy = field(default_factory=Fp16Policy)
    description: str = ""

    def tolerance(self, precision: str, output: str) -> Tolerance:
        """The bound for ``output`` of this graph at ``precision``."""
        override = self.output_tolerances.get(precision, {}).get(output)
        if override is not None:
            return override
        try:
            return self.tolerances[precision]
        except KeyError:
            raise ExportSpecError(
                f"graph {self.name!r} declares no tolerance for precision {precision!r} "
                f"(declared: {sorted(self.tolerances)})"
            ) from None

    def dims_used(self) -> tuple[str, ...]:
        """Dim names this graph's inputs use, in first-use order."""
        names: list[str] = []
        for tensor in self.inputs:
            for dim in self.dynamic_axes.get(tensor, {}).values():
                if dim not in names:
                    names.append(dim)
        return tuple(names)


@dataclass(frozen=True, eq=False)
class ExportSpec:
    """Everything export needs to know about one model; see the module docstring.

    Attributes:
        name: model name recorded in every graph's metadata (e.g. ``"acort-xsmall"``).
        graphs: the exportable parts, in export order (a composed graph after the graphs it composes).
        dims: dim name -> :class:`DimSpec`.
        parity_sizes: fresh size combinations parity checks run (never the export example alone); sizes may be
            0/1 here, the point is to exercise the dynamic axes.
        runtime_graphs: which graph a runtime loads per role: ``{"encoder": ..., "step": ...}``.
        state_names: decoder state tensors in the step graph's input order.
        updated_state_names: the states the step graph outputs (a new value each step), in ``state_names`` order;
            None = all. The others (cross-attention keys/values, the memory bias) are carried over unchanged by the
            runtime: re-emitting them would cost an output copy per step for nothing.
        tokens_name, logprobs_name, state_output_suffix: the step graph's interface (``RuntimeStepModel``).
        decode_inputs: the inputs a caller feeds to the runtime encoder graph.
        decoding: how a runtime decodes with the graphs: ``"autoregressive"`` (roles ``encoder`` + ``step``, the
            shared searches) or ``"mask_predict"`` (roles ``encoder`` + ``refine``, LaBERT's iterative refinement).
        length_levels: ``((L_low, L_high), ...)`` of a length-controllable model (LaBERT, ``*-len``), else ``()``.
        decode_defaults: per-level decoding defaults a runtime needs besides the graphs (mask-predict's
            ``refine_steps`` and ``eos_decay``), recorded in a bundle's manifest.
        opset: ONNX opset to export with.
        precisions: precisions exported by default.
        metadata: extra key/values stored in each graph's ``metadata_props``.
    """

    name: str
    graphs: tuple[GraphSpec, ...]
    dims: Mapping[str, DimSpec]
    parity_sizes: tuple[Mapping[str, int], ...]
    runtime_graphs: Mapping[str, str]
    state_names: tuple[str, ...] = ()
    updated_state_names: tuple[str, ...] | None = None
    tokens_name: str = "tokens"
    logprobs_name: str = "logprobs"
    state_output_suffix: str = "_out"
    decode_inputs: tuple[str, ...] = ()
    decoding: str = "autoregressive"
    length_levels: tuple[tuple[int, int], ...] = ()
    decode_defaults: Mapping[str, Any] = field(default_factory=dict)
    opset: int = DEFAULT_OPSET
    precisions: tuple[str, ...] = PRECISIONS
    metadata: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [g.name for g in self.graphs]
        if len(set(names)) != len(names):
            raise ExportSpecError(f"spec {self.name!r}: duplicate graph names {names}")
        unknown_precisions = [p for p in self.precisions if p not in PRECISIONS]
        if unknown_precisions:
            raise ExportSpecError(f"spec {self.name!r}: unknown precision(s) {unknown_precisions}; known {PRECISIONS}")
        if not self.opset >= 17:
            raise ExportSpecError(f"spec {self.name!r}: opset {self.opset} < 17 has no LayerNormalization")
        seen: set[str] = set()
        for graph in self.graphs:
            self._check_graph(graph, seen)
            seen.add(graph.name)
        if self.updated_state_names is not None:
            unknown = [n for n in self.updated_state_names if n not in self.state_names]
            if unknown:
                raise ExportSpecError(f"spec {self.name!r}: updated_state_names {unknown} are not in state_names")
        roles = DECODING_ROLES.get(self.decoding)
        if roles is None:
            known = list(DECODING_ROLES)
            raise ExportSpecError(f"spec {self.name!r}: unknown decoding {self.decoding!r}; known {known}")
        foreign = [r for r in self.runtime_graphs if r not in roles]
        if foreign:
            raise ExportSpecError(
                f"spec {self.name!r}: runtime role(s) {foreign} have no meaning for {self.decoding} decoding "
                f"(roles {list(roles)})"
            )
        for role, graph_name in self.runtime_graphs.items():
            if graph_name not in names:
                raise ExportSpecError(f"spec {self.name!r}: runtime role {role!r} names unknown graph {graph_name!r}")
        for i, sizes in enumerate(self.parity_sizes):
            for dim, size in sizes.items():
                if dim not in self.dims:
                    raise ExportSpecError(f"spec {self.name!r}: parity_sizes[{i}] names unknown dim {dim!r}")
                self.dims[dim].check(size, f"spec {self.name!r} parity_sizes[{i}]")

    def _check_graph(self, graph: GraphSpec, earlier: set[str]) -> None:
        where = f"spec {self.name!r} graph {graph.name!r}"
        if not graph.inputs or not graph.outputs:
            raise ExportSpecError(f"{where}: needs at least one input and one output")
        overlap = set(graph.inputs) & set(graph.outputs)
        if overlap:
            raise ExportSpecError(f"{where}: names {sorted(overlap)} are both inputs and outputs")
        for tensor, axes in graph.dynamic_axes.items():
            if tensor not in graph.inputs and tensor not in graph.outputs:
                raise ExportSpecError(f"{where}: dynamic_axes names unknown tensor {tensor!r}")
            for axis, dim in axes.items():
                if dim not in self.dims:
                    raise ExportSpecError(f"{where}: {tensor!r} axis {axis} uses undeclared dim {dim!r}")
        for part in graph.compose:
            if part not in earlier:
                raise ExportSpecError(f"{where}: composes {part!r}, which is not an earlier graph of the spec")
        for precision in self.precisions:
            graph.tolerance(precision, graph.outputs[0])

    # -- queries ---------------------------------------------------------------------------------------------------
    def graph(self, name: str) -> GraphSpec:
        for graph in self.graphs:
            if graph.name == name:
                return graph
        raise ExportSpecError(f"spec {self.name!r} has no graph {name!r}; graphs: {[g.name for g in self.graphs]}")

    @property
    def graph_names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.graphs)

    def example_sizes(self) -> dict[str, int]:
        """The sizes export traces with (all >= 2 on dynamic dims)."""
        return {name: dim.example for name, dim in self.dims.items()}

    def sizes_for(self, graph: GraphSpec, sizes: Mapping[str, int]) -> dict[str, int]:
        """``sizes`` completed with example sizes for dims it leaves out, range-checked for ``graph``."""
        full = {**self.example_sizes(), **sizes}
        for dim in graph.dims_used():
            self.dims[dim].check(full[dim], f"graph {graph.name!r}")
        return full

    @property
    def step_state_names(self) -> tuple[str, ...]:
        """The states the step graph outputs, in ``state_names`` order."""
        if self.updated_state_names is None:
            return self.state_names
        return tuple(n for n in self.state_names if n in self.updated_state_names)

    @property
    def state_output_names(self) -> tuple[str, ...]:
        """The step graph's state outputs, one per :attr:`step_state_names` entry."""
        return tuple(f"{n}{self.state_output_suffix}" for n in self.step_state_names)

    def replace(self, **changes: Any) -> ExportSpec:
        """A copy with ``changes`` (validated again), e.g. ``spec.replace(opset=18, precisions=("fp32",))``."""
        return dataclasses.replace(self, **changes)


# -- registry --------------------------------------------------------------------------------------------------------

#: builder(model, *, backbone, name) -> ExportSpec
SpecBuilder = Callable[..., ExportSpec]


def _builder(family: str) -> SpecBuilder | None:
    from edgecap.workshop.models import family_hooks

    hooks = family_hooks(family)
    return hooks.resolve("export_spec") if hooks.export_spec is not None else None


def list_export_families() -> list[str]:
    """Families that have an export spec (their ``FamilyHooks.export_spec`` names one)."""
    from edgecap.workshop.models import family_hooks, list_families

    return sorted(f for f in list_families() if family_hooks(f).export_spec is not None)


def get_export_spec(
    model: nn.Module, *, backbone: nn.Module | None = None, name: str | None = None, **options: Any
) -> ExportSpec:
    """The export spec of ``model`` (looked up by ``model.cfg.family``).

    Args:
        model: a :class:`~edgecap.workshop.models.CaptionModel`.
        backbone: include this image backbone in the encoder graph (input ``pixel_values``).
        name: model name recorded in the graphs' metadata; default the family.
        **options: builder-specific options (e.g. ``max_batch``).

    Raises:
        ExportSpecError: the model has no ``cfg.family`` or no spec is registered for it.
    """
    from edgecap.workshop.models import UnknownModelError

    family = getattr(getattr(model, "cfg", None), "family", None)
    if family is None:
        raise ExportSpecError(f"{type(model).__name__} has no cfg.family; cannot find its export spec")
    try:
        builder = _builder(family)
    except UnknownModelError as exc:
        raise ExportSpecError(str(exc)) from None
    if builder is None:
        raise ExportSpecError(
            f"model family {family!r} names no export spec (FamilyHooks.export_spec); "
            f"families with one: {list_export_families()}"
        )
    return builder(model, backbone=backbone, name=name, **options)
