"""Export spec of the ExpansionNet family (``edgecap.workshop.models.expansionnet``): the generic captioning graphs
(encoder with optional backbone, start, init, cached step) plus the family's float16 policy and tolerances.

Float16 (``Fp16Policy``): weights and matmuls go to float16, inputs/outputs stay float32, and these stay float32:

- ``LayerNormalization`` / ``ReduceMean`` / ``Softmax`` / ``LogSoftmax``, as for ORT;
- the expansion normalisation ``Ψ(X, ε) = X / (ΣX + ε)`` (v2 Eq. 6): every ancestor of its ``Div`` back to the
  projections (``ReLU(±M)``, the masks, ``ReduceSum``, ``+ ε``). ε = 1e-9 is zero in float16, so an all-zero row
  (a slot whose scores are all negative on one path) would become 0/0 = NaN, and sums over up to 512 slots lose
  resolution, so the sum-normalisations stay in FP32; the official export instead raised ε to
  1e-4 and could not make float16 work at all (jchenghu/ExpansionNet_v2, ``onnx4tensorrt/``).

Tolerances are element-wise bounds set from measured errors with a margin (``tests/workshop/export/test_parity.py``
checks ``expansionnet-test`` against them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from edgecap.workshop.export.spec import ExportSpec, Fp16Policy, Tolerance
from edgecap.workshop.export.specs.captioning import EncoderGraph, InitGraph, captioning_spec

__all__ = ["EXPANSIONNET_FP16", "EXPANSIONNET_TOLERANCES", "expansionnet_export_spec"]

_KEEP_FP32 = ("LayerNormalization", "ReduceMean", "Softmax", "LogSoftmax", "Log", "Exp", "Pow", "Sqrt")
_POLICY = Fp16Policy(op_types=_KEEP_FP32, fp32_ancestors_of=("Div",))
EXPANSIONNET_FP16: dict[str, Fp16Policy] = {"encoder": _POLICY, "start": _POLICY, "init": _POLICY, "step": _POLICY}

EXPANSIONNET_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(atol=1e-4, rtol=1e-4),
    "fp16": Tolerance(atol=2e-2, rtol=2e-2),
}


class _BoxTiedEncoderGraph(EncoderGraph):
    """The encoder graph with the shared ``(features, boxes, feature_mask)`` interface.

    ExpansionNet has no box geometry, so a traced graph would lose its ``boxes`` input and runtimes would have to
    feed this family differently. A ``0 · Σ boxes`` term keeps the input (simplifiers do not fold a product with a
    non-constant tensor) and adds exactly 0 for the finite boxes the model contract requires.
    """

    def forward(self, features: torch.Tensor, boxes: torch.Tensor, feature_mask: torch.Tensor) -> tuple[torch.Tensor]:
        (memory,) = super().forward(features, boxes, feature_mask)
        return (memory + (boxes.sum(dim=(1, 2)) * 0.0)[:, None, None].to(memory.dtype),)


def _tie_boxes(spec: ExportSpec) -> ExportSpec:
    encoder = _BoxTiedEncoderGraph(spec.graph("encoder").module.model)
    graphs = []
    for graph in spec.graphs:
        if graph.name == "encoder":
            graph = dataclasses.replace(graph, module=encoder)
        elif graph.name == "init":
            graph = dataclasses.replace(graph, module=InitGraph(encoder, graph.module.start, graph.module.mask_input))
        graphs.append(graph)
    return spec.replace(graphs=tuple(graphs))


def expansionnet_export_spec(
    model: nn.Module, *, backbone: nn.Module | None = None, name: str | None = None, **options: Any
) -> ExportSpec:
    """The spec of an ``ExpansionNetCaptioner``; ``options`` go to :func:`captioning_spec`."""
    spec = captioning_spec(
        model,
        tolerances=EXPANSIONNET_TOLERANCES,
        fp16=EXPANSIONNET_FP16,
        backbone=backbone,
        name=name,
        **options,
    )
    return spec if backbone is not None else _tie_boxes(spec)
