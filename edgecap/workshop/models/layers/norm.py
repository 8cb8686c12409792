"""Layer normalisation variants.

The ORT/ACORT reference uses the "Annotated Transformer" LayerNorm: ``a * (x - mean) / (std + eps) + b`` with the
*unbiased* standard deviation and ``eps`` added to the std. It is numerically different from ``nn.LayerNorm`` and
does not match the LayerNorm pattern that ONNX (opset 17 ``LayerNormalization``) and TensorRT fuse, so fresh edgecap
models use the standard form; the annotated form exists only to reproduce or port reference checkpoints.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["AnnotatedLayerNorm", "NORM_KINDS", "make_norm"]

NORM_KINDS = ("standard", "annotated")


class AnnotatedLayerNorm(nn.Module):
    """``a * (x - mean) / (std_unbiased + eps) + b`` over the last axis (reference-compatible)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True, unbiased=True)
        return self.weight * (x - mean) / (std + self.eps) + self.bias


def make_norm(kind: str, dim: int) -> nn.Module:
    """``"standard"``: ``nn.LayerNorm(dim, eps=1e-5)`` (exporter/TensorRT friendly); ``"annotated"``: the reference's.

    Both hold ``2 * dim`` parameters, so parameter counts do not depend on the choice.
    """
    if kind == "standard":
        return nn.LayerNorm(dim, eps=1e-5)
    if kind == "annotated":
        return AnnotatedLayerNorm(dim, eps=1e-6)
    raise ValueError(f"unknown layer_norm {kind!r}; choose one of {NORM_KINDS}")
