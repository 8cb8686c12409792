"""TensorRT optimisation profiles derived from a bundle's dynamic axes: one (min, opt, max) shape per graph input.

Every dynamic dimension of an exported graph carries the name of its export-spec dimension, and the bundle manifest
records each dimension's range (``interface.dims``). A profile maps those names to engine ranges:

- ``batch``: the rows a graph sees. The encoder and LaBERT's ``refine`` run once per image (1 .. ``max_batch``); the
  autoregressive ``step`` runs once per hypothesis, ``batch × beam`` rows (1 .. ``max_batch · beam``). ``opt`` is the
  maximum: engines are tuned for the large-batch throughput they exist for, and smaller batches still run.
- ``images``: the leading dimension of the step graph's image states (the cross-attention keys and the memory bias),
  which ONNX Runtime is fed once per image. The TensorRT runtime gathers every state once per hypothesis on the
  device (its ``expand`` engine), so the range is the step's rows.
- ``past``: the cache length, the manifest's range (0 at the first step, empty caches, to the longest caption minus
  one); ``opt`` is its middle, where an average caption spends its steps.
- ``regions``: region features of a features-in bundle (1 .. the manifest's maximum, or ``max_regions``); a pixels-in
  bundle's grid is fixed and so is every shape derived from it (the image size is fixed in the graph).
- ``length``: LaBERT's caption length (the manifest's range; ``opt`` its maximum, the longest level's passes).

Everything here is plain Python (no TensorRT), so the shapes are tested on any machine.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgecap.runtime.backends.base import IMAGE_DIM, Dim, TensorMeta
from edgecap.runtime.engines.graphs import GraphIO

__all__ = [
    "ROW_DIM",
    "EngineProfile",
    "ProfileError",
    "ProfileRequest",
    "dim_ranges",
    "eval_dim",
    "graph_profile",
    "rows_for_role",
]

#: The dimension holding one row per image or hypothesis (axis 0 of every tensor; the decoding contract).
ROW_DIM = "batch"
#: Roles that run once per hypothesis (rows = images × beams); the others run once per image.
_PER_HYPOTHESIS = frozenset({"step"})


class ProfileError(ValueError):
    """A profile the bundle's dimension ranges cannot serve, or a graph dimension the manifest does not declare."""


@dataclass(frozen=True)
class ProfileRequest:
    """What the engines must serve.

    Attributes:
        max_batch: images per call (``Captioner.batch`` batch size, ``edgecap bench`` batch).
        beam: beam width of the step graph (rows = images × beam); 1 for greedy decoding.
        max_regions: cap on a features-in bundle's region count (None: the manifest's maximum).
    """

    max_batch: int = 16
    beam: int = 3
    max_regions: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_batch", "beam"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProfileError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_regions is not None and (not isinstance(self.max_regions, int) or self.max_regions < 1):
            raise ProfileError(f"max_regions must be an integer >= 1 or None, got {self.max_regions!r}")


@dataclass(frozen=True)
class EngineProfile:
    """One optimisation profile: per dynamic input, its (min, opt, max) shapes; plus every dimension's range."""

    role: str
    shapes: Mapping[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]
    dims: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "shapes": {n: [list(s) for s in mom] for n, mom in self.shapes.items()},
            "dims": {n: list(r) for n, r in self.dims.items()},
        }

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of the shapes (a cache-key component)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def max_sizes(self) -> dict[str, int]:
        """Each dimension at its maximum (what buffers are sized for)."""
        return {n: r[2] for n, r in self.dims.items()}


def rows_for_role(role: str, request: ProfileRequest) -> int:
    """The most rows ``role``'s graph sees: images, or images × beams for the step graph."""
    return request.max_batch * (request.beam if role in _PER_HYPOTHESIS else 1)


def dim_ranges(
    manifest_dims: Mapping[str, Mapping[str, int]], role: str, request: ProfileRequest
) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) of every dimension the manifest declares, for ``role``'s graph.

    Raises:
        ProfileError: the request exceeds a dimension's exported range (e.g. more rows than ``max_batch`` at export).
    """
    out: dict[str, tuple[int, int, int]] = {}
    for name, entry in manifest_dims.items():
        low, high = int(entry["min"]), int(entry["max"])
        if name == ROW_DIM:
            rows = rows_for_role(role, request)
            if rows > high:
                raise ProfileError(
                    f"{role}: {rows} rows (max_batch {request.max_batch}"
                    f"{f' × beam {request.beam}' if role in _PER_HYPOTHESIS else ''}) exceed the {high} rows the "
                    "graphs were exported for; lower --max-batch/--beam or re-export with a larger max batch"
                )
            out[name] = (max(low, 1), rows, rows)
        elif name == IMAGE_DIM:  # once per hypothesis on TensorRT (see the module docstring)
            top = min(high, rows_for_role(role, request))
            out[name] = (max(low, 1), top, top)
        elif low == high:
            out[name] = (low, low, low)
        elif name == "regions":
            top = high if request.max_regions is None else min(high, request.max_regions)
            if top < max(low, 1):
                raise ProfileError(f"max_regions {request.max_regions} is below the graphs' minimum {low}")
            out[name] = (max(low, 1), top, top)
        elif name == "past":
            out[name] = (low, max(low, (low + high) // 2), high)
        else:  # length and any other dimension: tuned for its maximum
            out[name] = (low, high, high)
    return out


_TERM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*|\d+)\s*$")


def eval_dim(dim: Dim, sizes: Mapping[str, int]) -> int:
    """A graph dimension at concrete sizes: an int, a dimension name, or a sum/difference the exporter wrote for an
    output (``"past + 1"``).

    Raises:
        ProfileError: an unknown name or an expression that is not a sum of names and integers.
    """
    if isinstance(dim, int):
        return dim
    if dim is None:
        raise ProfileError("a dynamic dimension without a name has no size")
    total, sign = 0, 1
    for token in re.split(r"\s*([+-])\s*", dim.strip()):
        if token == "+":
            sign = 1
            continue
        if token == "-":
            sign = -1
            continue
        match = _TERM.match(token)
        if match is None:
            raise ProfileError(f"dimension {dim!r} is not a sum of dimension names and integers")
        term = match.group(1)
        if term.isdigit():
            value = int(term)
        elif term in sizes:
            value = int(sizes[term])
        else:
            raise ProfileError(f"dimension {dim!r} names {term!r}, which the bundle does not declare ({sorted(sizes)})")
        total += sign * value
    return total


def _shape_at(spec: TensorMeta, sizes: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(eval_dim(d, sizes) for d in spec.shape)


def graph_profile(
    role: str,
    io: GraphIO,
    manifest_dims: Mapping[str, Mapping[str, int]],
    request: ProfileRequest,
    inputs: Sequence[str] | None = None,
) -> EngineProfile:
    """The profile of ``role``'s graph: a (min, opt, max) shape for every input with a dynamic dimension.

    Args:
        role: ``"encoder"``, ``"step"`` or ``"refine"`` (decides what ``batch`` counts).
        io: the graph's inputs (:func:`~edgecap.runtime.engines.graphs.read_graph_io`).
        manifest_dims: the bundle manifest's ``interface.dims``.
        request: batch, beam and region caps.
        inputs: only these inputs (default all).

    Raises:
        ProfileError: a dynamic input dimension the manifest does not declare, or a request beyond the export.
    """
    ranges = dim_ranges(manifest_dims, role, request)
    points = [{n: r[i] for n, r in ranges.items()} for i in range(3)]
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
    for spec in io.inputs:
        if inputs is not None and spec.name not in inputs:
            continue
        unknown = [d for d in spec.dynamic_dims if d not in ranges and not _is_expression(d)]
        if unknown:
            raise ProfileError(
                f"{role}: input {spec.name!r} has dynamic dimension(s) {unknown} that the bundle manifest does not "
                f"declare (interface.dims: {sorted(ranges)})"
            )
        if not spec.dynamic_dims:
            continue
        low, opt, high = (_shape_at(spec, p) for p in points)
        shapes[spec.name] = (low, opt, high)
    used = {d for s in io.inputs for d in s.dynamic_dims}
    return EngineProfile(role, shapes, {n: r for n, r in ranges.items() if n in used})


def _is_expression(dim: str) -> bool:
    return "+" in dim or "-" in dim
