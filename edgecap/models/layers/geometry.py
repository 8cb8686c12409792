"""Box-relational (geometric) attention bias of the Object Relation Transformer (Herdade et al. 2019, §3.2;
ACORT §3).

Every pair of boxes (query ``m``, key ``n``) gets four log-ratio features, a sinusoidal embedding of them, and per
attention head a learned weight ``ω = ReLU(W_G · E + b)``. Encoder self-attention then uses
``softmax(log(max(ω, 1e-6)) + QKᵀ/√d_k)``, i.e. it multiplies the attention weights by ``ω``; ``ω = 0`` becomes a
near-hard mask (a −13.8 bias). The embedding depends only on the boxes, so the encoder computes it once per forward
and each layer applies its own ``W_G`` (ORT issue #2: same CIDEr, −18 % training time).
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["GeometricBias", "box_relational_embedding", "box_relational_features"]

#: Lower bound on box width/height, so degenerate boxes never divide by zero when ``wh_offset`` is 0.
MIN_BOX_SIZE = 1e-3
#: ``log(max(|Δc| / w, 1e-3))``: the reference's floor on centre offsets (identical centres -> log(1e-3)).
MIN_CENTRE_RATIO = 1e-3
#: ``log(max(ω, 1e-6))``: the reference's floor on geometric weights.
MIN_WEIGHT = 1e-6
LOG_MIN_WEIGHT = math.log(MIN_WEIGHT)


def box_relational_features(boxes: torch.Tensor, wh_offset: float = 0.0) -> torch.Tensor:
    """Pairwise ``(Δx, Δy, Δw, Δh)`` for boxes ``(B, N, 4)`` as ``(x1, y1, x2, y2)`` -> ``(B, N, N, 4)``.

    Row ``m`` is the query box, column ``n`` the key box:
    ``Δx = log(max(|cx_m − cx_n| / w_m, 1e-3))``, ``Δy`` likewise with ``h_m``, ``Δw = log(w_m / w_n)``,
    ``Δh = log(h_m / h_n)``.

    Args:
        boxes: ``(B, N, 4)`` normalised corner boxes.
        wh_offset: added to every width and height. The reference adds ``1.0`` (a leftover from pixel
            coordinates that squeezes normalised sizes into [1, 2]); keep it only to reproduce reference
            checkpoints. Sizes are floored at ``1e-3`` either way.
    """
    x1, y1, x2, y2 = boxes.unbind(-1)
    cx, cy = (x1 + x2) * 0.5, (y1 + y2) * 0.5
    w = (x2 - x1 + wh_offset).clamp_min(MIN_BOX_SIZE)
    h = (y2 - y1 + wh_offset).clamp_min(MIN_BOX_SIZE)
    dx = ((cx[:, :, None] - cx[:, None, :]).abs() / w[:, :, None]).clamp_min(MIN_CENTRE_RATIO).log()
    dy = ((cy[:, :, None] - cy[:, None, :]).abs() / h[:, :, None]).clamp_min(MIN_CENTRE_RATIO).log()
    dw = (w[:, :, None] / w[:, None, :]).log()
    dh = (h[:, :, None] / h[:, None, :]).log()
    return torch.stack((dx, dy, dw, dh), dim=-1)


def box_relational_embedding(
    boxes: torch.Tensor,
    dim: int = 64,
    wh_offset: float = 0.0,
    scale: float = 100.0,
    wave_len: float = 1000.0,
) -> torch.Tensor:
    """Sinusoidal embedding ``(B, N, N, dim)`` of :func:`box_relational_features`.

    The 4 features are scaled by ``scale`` (100), multiplied by ``dim // 8`` frequencies ``1 / wave_len^(k / (dim//8))``
    (feature-major: 4 features × 8 frequencies = 32 angles) and embedded as ``[sin(angles), cos(angles)]``, the
    reference layout, so ``W_G`` weights port across. Computed in float32 whatever the box dtype: the angles reach
    ~700 rad, where float16 has a resolution of 0.5 rad.
    """
    if dim % 8:
        raise ValueError(f"geometry embedding dim must be a multiple of 8 (4 features × sin/cos), got {dim}")
    feats = box_relational_features(boxes.float(), wh_offset) * scale
    n_freq = dim // 8
    freqs = wave_len ** (-torch.arange(n_freq, device=boxes.device, dtype=torch.float32) / n_freq)
    angles = (feats[..., None] * freqs).flatten(-2)
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


class GeometricBias(nn.Module):
    """Per-head ``log(max(ReLU(W_G · E + b), 1e-6))`` as an additive attention bias ``(B, H, N, N)``.

    One ``Linear(dim, heads)`` is the same as the paper's ``heads`` separate ``Linear(dim, 1)`` (same
    ``heads · (dim + 1)`` parameters) but one matmul instead of ``heads``.
    """

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, heads)

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        """``embedding`` (B, N, N, dim) float32 -> bias (B, H, N, N) float32.

        ``W_G`` runs in its own dtype (sin/cos values are safe in float16); the floor and log run in float32, where
        1e-6 is a normal number.
        """
        omega = torch.relu(self.proj(embedding.to(self.proj.weight.dtype))).float().clamp_min(MIN_WEIGHT)
        return omega.log().permute(0, 3, 1, 2)
