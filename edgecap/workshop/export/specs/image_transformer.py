"""Export spec of the Image Transformer family (``edgecap.workshop.models.image_transformer``): the generic captioning
graphs
(encoder with optional backbone, start, init, step) plus the family's float16 policy and tolerances.

The step graph carries the LSTM: its state (``lstm_h``, ``lstm_c``, ``context``) has a fixed size, so the step
updates it in place of a growing cache, and the branches' keys/values, the memory bias and the memory mean are
carried unchanged by the runtime.

Float16 (``Fp16Policy``): weights and matmuls go to float16, inputs/outputs stay float32, and these stay float32:

- ``LayerNormalization`` / ``ReduceMean`` / ``Softmax`` / ``LogSoftmax``, as for the other families;
- the spatial graph (Eq. 5) and the multi-scale tiling: every ancestor of the overlap comparisons and of the tile
  ``Floor``, back to the ``boxes`` input. Ratios near ε = 0.9 and centres near a tile edge would otherwise flip a
  relation or a tile membership (float16's step at 0.9 is 0.0005);
- in a pixels-in bundle, the backbone (the ``pixel_values`` cone up to the first ``MatMul``): this encoder amplifies
  the float16 backbone's error far more than ACORT's does. Measured on a trained ``image-transformer-xsmall``
  (EfficientNet-Lite0 inside): memory max error 0.151 with the backbone in float16 (1,259 elements over tolerance),
  0.026 with only its convolutions in float32, 0.0036 with the backbone in float32 (features in: 0.0025).

Tolerances are element-wise bounds set from measured errors with a margin (``tests/workshop/export/test_parity.py``
checks ``image-transformer-test`` against them).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from edgecap.workshop.export.spec import ExportSpec, Fp16Policy, Tolerance
from edgecap.workshop.export.specs.captioning import captioning_spec

__all__ = ["IMAGE_TRANSFORMER_FP16", "IMAGE_TRANSFORMER_TOLERANCES", "image_transformer_export_spec"]

_KEEP_FP32 = ("LayerNormalization", "ReduceMean", "Softmax", "LogSoftmax", "Log", "Exp", "Pow", "Sqrt")
_ENCODER = Fp16Policy(
    op_types=_KEEP_FP32,
    fp32_ancestors_of=("GreaterOrEqual", "Greater", "Floor"),
    fp32_input_cones=("pixel_values",),
    cone_stops=("MatMul", "Gemm"),
)
_DECODER = Fp16Policy(op_types=_KEEP_FP32)
IMAGE_TRANSFORMER_FP16: dict[str, Fp16Policy] = {
    "encoder": _ENCODER,
    "start": _DECODER,
    "init": _ENCODER,
    "step": _DECODER,
}

IMAGE_TRANSFORMER_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(atol=1e-4, rtol=1e-4),
    "fp16": Tolerance(atol=2e-2, rtol=2e-2),
}


def image_transformer_export_spec(
    model: nn.Module, *, backbone: nn.Module | None = None, name: str | None = None, **options: Any
) -> ExportSpec:
    """The spec of an ``ImageTransformerCaptioner``; ``options`` go to :func:`captioning_spec`."""
    return captioning_spec(
        model,
        tolerances=IMAGE_TRANSFORMER_TOLERANCES,
        fp16=IMAGE_TRANSFORMER_FP16,
        backbone=backbone,
        name=name,
        **options,
    )
