"""What an export produces: each graph at each precision with its summary, the whole result with the report a
bundle manifest consumes, and the error any step of an export raises.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

from onnx import ModelProto

from edgecap._version import __version__
from edgecap.workshop.export.graph import count_ops
from edgecap.workshop.export.spec import ExportSpec


class ExportError(ValueError):
    """A graph that cannot be exported, validated or converted; the message names the graph and the cause."""


@dataclasses.dataclass
class ExportedGraph:
    """One graph at one precision.

    Attributes:
        name: graph role (``"encoder"``, ``"step"``, …).
        precision: ``"fp32"`` / ``"fp16"``.
        model: the ONNX model.
        path: where it was written (None when exported in memory).
        parity: the :func:`~edgecap.workshop.export.parity.check_graph` report, or None when parity was skipped.
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
        checked = [r for r in reports if r is not None]
        if len(checked) != len(reports):
            return None
        return all(r["passed"] for r in checked)

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
