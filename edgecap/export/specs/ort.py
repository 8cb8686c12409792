"""Export spec of the ORT/ACORT family (``edgecap.models.ort``): the generic captioning graphs plus the family's
float16 policy and measured tolerances.

Float16 (``Fp16Policy``): weights and matmuls go to float16, inputs/outputs stay float32, and these stay float32:

- ``LayerNormalization`` / ``ReduceMean``: variance of activations that grow along the residual stream;
- ``Softmax`` / ``LogSoftmax``: the −1e4 padding bias and 771-way radix log-probs, where float16's step at 16 is
  0.016;
- the box-relational embedding (ORT §3.2): the forward cone of ``boxes`` up to the ``W_G`` projection
  (log-ratios scaled by 100 reach ~700 rad before ``sin``/``cos``; float16's resolution there is 0.5 rad), and
  ``Log``/``Exp``/``Sin``/``Cos`` wherever else they appear (e.g. the constant grid of a backbone bundle).

The tolerances are element-wise bounds set from measured errors with a margin
(``tests/export/test_parity.py`` checks every registered test config against them).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from edgecap.export.spec import ExportSpec, Fp16Policy, Tolerance, register_export_spec
from edgecap.export.specs.captioning import captioning_spec

__all__ = ["ORT_FP16", "ORT_TOLERANCES", "ort_export_spec"]

_KEEP_FP32 = ("LayerNormalization", "ReduceMean", "Softmax", "LogSoftmax", "Log", "Exp", "Sin", "Cos", "Pow", "Sqrt")

ORT_FP16: dict[str, Fp16Policy] = {
    "encoder": Fp16Policy(op_types=_KEEP_FP32, fp32_input_cones=("boxes",)),
    "start": Fp16Policy(op_types=_KEEP_FP32),
    "init": Fp16Policy(op_types=_KEEP_FP32, fp32_input_cones=("boxes",)),
    "step": Fp16Policy(op_types=_KEEP_FP32),
}

ORT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(atol=1e-4, rtol=1e-4),
    "fp16": Tolerance(atol=5e-2, rtol=2e-2),
}


def ort_export_spec(
    model: nn.Module, *, backbone: nn.Module | None = None, name: str | None = None, **options: Any
) -> ExportSpec:
    """The spec of an ``ORTCaptioner`` (ORT or ACORT); ``options`` go to :func:`captioning_spec`."""
    return captioning_spec(
        model, tolerances=ORT_TOLERANCES, fp16=ORT_FP16, backbone=backbone, name=name, **options
    )


register_export_spec("ort", ort_export_spec)
