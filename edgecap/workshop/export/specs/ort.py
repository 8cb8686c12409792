"""Export spec of the ORT/ACORT family (``edgecap.workshop.models.ort``): the generic captioning graphs plus the
family's float16 policy and measured tolerances.

Float16 (``Fp16Policy``): weights and matmuls go to float16, inputs/outputs stay float32, and these stay float32:

- ``LayerNormalization`` / ``ReduceMean``: variance of activations that grow along the residual stream;
- ``Softmax`` / ``LogSoftmax``: the −1e4 padding bias and 771-way radix log-probs, where float16's step at 16 is
  0.016;
- the box-relational embedding (ORT §3.2): everything computing the inputs of ``sin``/``cos``, back to the
  ``boxes`` input or a backbone bundle's constant grid (log-ratios scaled by 100 reach ~700 rad; float16's
  resolution there is 0.5 rad), plus ``Log``/``Exp`` wherever they appear (``log(max(ω, 1e-6))``: 1e-6 is
  subnormal in float16).

The −1e4 padding bias needs no island: −10000 is exactly representable in float16 (a multiple of its step 8 at
that magnitude) and the softmax reading it runs in float32.

The tolerances are element-wise bounds set from measured errors with a margin
(``tests/workshop/export/test_parity.py`` checks every registered test config against them).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from edgecap.workshop.export.spec import ExportSpec, Fp16Policy, Tolerance
from edgecap.workshop.export.specs.captioning import captioning_spec
from edgecap.workshop.export.specs.layer_caches import CACHE_LAYOUTS, PerLayerCaches

__all__ = ["ENCODER_TOLERANCES", "ORT_FP16", "ORT_TOLERANCES", "ort_export_spec"]

_KEEP_FP32 = ("LayerNormalization", "ReduceMean", "Softmax", "LogSoftmax", "Log", "Exp", "Sin", "Cos", "Pow", "Sqrt")

#: The box angles (up to ~700 rad; float16 resolves 0.5 rad there) stay float32 back to the boxes, including the
#: frequency matmul that forms them (:func:`~edgecap.workshop.models.layers.geometry.box_relational_angles`): no learned
#: projection lies on that path, so only ``Gemm``/``Conv`` end the walk.
_ENCODER_FP16 = Fp16Policy(op_types=_KEEP_FP32, fp32_ancestors_of=("Sin", "Cos"), cone_stops=("Gemm", "Conv"))
ORT_FP16: dict[str, Fp16Policy] = {
    "encoder": _ENCODER_FP16,
    "start": Fp16Policy(op_types=_KEEP_FP32),
    "init": _ENCODER_FP16,
    "step": Fp16Policy(op_types=_KEEP_FP32),
}

#: Step and start graphs: ONNX Runtime and torch agree to float32 rounding (measured <= 1e-6 fp32; <= 3e-3 fp16).
ORT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(atol=1e-4, rtol=1e-4),
    "fp16": Tolerance(atol=1e-2, rtol=1e-2),
}
#: Graphs with the box-relational encoder. The embedding scales log-ratios by 100 before sin/cos and the bias is
#: ``log(max(ω, 1e-6))``: a 1-ulp difference between ONNX Runtime's and torch's float32 ``Log`` becomes ~1e-5 rad in an
#: angle and up to ~1.5e-4 in the memory (measured; float64 torch is no closer to either), so float32 needs 1e-3.
#: Float16 measured up to 3.2e-2 absolute on unit-scale memory values.
ENCODER_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(atol=1e-3, rtol=1e-3),
    "fp16": Tolerance(atol=1e-1, rtol=5e-2),
}


def ort_export_spec(
    model: nn.Module,
    *,
    backbone: nn.Module | None = None,
    name: str | None = None,
    cache_layout: str | None = None,
    **options: Any,
) -> ExportSpec:
    """The spec of an ``ORTCaptioner`` (ORT or ACORT); ``options`` go to :func:`captioning_spec`.

    ``cache_layout``: ``"per-layer"`` (one cache state per decoder position: fewer copies per step on ONNX Runtime's
    CPU provider, :mod:`edgecap.workshop.export.specs.layer_caches`), ``"stacked"`` (one (B, L, H, T, d_k) cache state,
    the model's own), or None (the default): per-layer for a model with the stacked self-attention cache, else the
    model's own state (a wrapper such as :class:`~edgecap.workshop.torch_runtime.prefix.PrefixRerunModel` has no cache).
    """
    if cache_layout is None:
        cache_layout = "per-layer" if PerLayerCaches.applies_to(model) else "stacked"
    if cache_layout not in CACHE_LAYOUTS:
        raise ValueError(f"unknown cache_layout {cache_layout!r}; choose one of {CACHE_LAYOUTS}")
    return captioning_spec(
        PerLayerCaches(model) if cache_layout == "per-layer" else model,
        tolerances=ORT_TOLERANCES,
        graph_tolerances={"encoder": ENCODER_TOLERANCES, "init": ENCODER_TOLERANCES},
        fp16=ORT_FP16,
        backbone=backbone,
        name=name,
        **options,
    )
