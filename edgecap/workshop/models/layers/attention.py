"""Multi-head scaled dot-product attention with optional attention-parameter sharing (ACORT §4.3, Fig. 5–6).

Written with plain matmul/softmax (no ``nn.MultiheadAttention``) so that the cached decoder step exports with the
dynamo ONNX exporter for any cache length, including 0, and so that the projections can be shared:

- ``share=None``: ``W_Q, W_K, W_V, W_O`` (4 Linear layers).
- ``share="kv"``: ``V`` *is* the projected ``K`` (3 Linear layers); the projection runs once and a decoder caches
  only ``K`` for self- and cross-attention. ACORT's choice for encoder and decoder (Table 10).
- ``share="qk"``: ``K`` uses ``W_Q`` (3 Linear layers); in self-attention ``Q`` and ``K`` are the same tensor.

Masks are additive float biases with a finite ``MASK_VALUE`` (−1e4) instead of ``-inf``/``-1e9``: representable in
float16, and a fully masked row softmaxes to a uniform distribution instead of NaN.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

__all__ = [
    "MASK_VALUE",
    "SHARE_KINDS",
    "MultiHeadAttention",
    "attention_weights",
    "causal_bias",
    "mask_to_bias",
    "scaled_dot_product",
]

MASK_VALUE = -1e4
SHARE_KINDS = (None, "kv", "qk")


def mask_to_bias(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Key-padding mask ``(B, N)`` (True = valid; None = all valid) -> additive bias ``(B, 1, 1, N)``.

    ``like`` (B, N, ...) supplies batch, length, dtype and device when ``mask`` is None.
    """
    if mask is None:
        return like.new_zeros(like.shape[0], 1, 1, like.shape[1])
    zeros = torch.zeros((), dtype=like.dtype, device=like.device)
    return torch.where(mask[:, None, None, :], zeros, torch.full_like(zeros, MASK_VALUE))


def causal_bias(length: int, like: torch.Tensor) -> torch.Tensor:
    """``(1, 1, T, T)`` bias that hides future positions (``MASK_VALUE`` above the diagonal)."""
    full = torch.full((length, length), MASK_VALUE, dtype=like.dtype, device=like.device)
    return torch.triu(full, diagonal=1)[None, None]


def attention_weights(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(q kᵀ / √d_k + bias)`` for ``q`` (B, H, T, d_k), ``k`` (B, H, S, d_k) -> (B, H, T, S)."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if bias is not None:
        scores = scores + bias
    return torch.softmax(scores, dim=-1)


def scaled_dot_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    dropout: nn.Module | None = None,
) -> torch.Tensor:
    """Attention output ``(B, H, T, d_k)``; ``dropout`` (if given) acts on the attention weights, as in ORT."""
    probs = attention_weights(q, k, bias)
    if dropout is not None:
        probs = dropout(probs)
    return torch.matmul(probs, v)


class MultiHeadAttention(nn.Module):
    """Multi-head attention whose projections can be shared (``share`` in ``{None, "kv", "qk"}``).

    The projection helpers return head-split tensors ``(B, H, T, d_k)``; :meth:`attend` runs the attention and the
    output projection. Callers that cache keys/values (the decoder step) use the helpers directly; everything else
    calls :meth:`forward`.
    """

    def __init__(
        self, dim: int, heads: int, share: str | None = None, dropout: float = 0.0, head_dim: int | None = None
    ) -> None:
        """``head_dim`` None: ``dim // heads`` (the usual square projections). A structurally pruned model keeps its
        original ``d_k`` with fewer heads, so its projections are ``dim -> heads · head_dim`` and back."""
        super().__init__()
        if share not in SHARE_KINDS:
            raise ValueError(f"unknown attention sharing {share!r}; choose one of {SHARE_KINDS}")
        if head_dim is None and dim % heads:
            raise ValueError(f"d_model {dim} is not divisible by {heads} heads")
        self.dim, self.heads, self.share = dim, heads, share
        self.head_dim = dim // heads if head_dim is None else head_dim
        inner = heads * self.head_dim
        self.q_proj = nn.Linear(dim, inner)
        self.k_proj = nn.Linear(dim, inner) if share != "qk" else None
        self.v_proj = nn.Linear(dim, inner) if share != "kv" else None
        self.out_proj = nn.Linear(inner, dim)
        self.dropout = nn.Dropout(dropout)

    @property
    def separate_values(self) -> bool:
        """False under Share-KV, where values are the keys and a cache stores only ``K``."""
        return self.share != "kv"

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def project_query(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d) -> queries (B, H, T, d_k)."""
        return self._split(self.q_proj(x))

    def project_memory(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, H, S, d_k) of a source sequence (cross-attention); under Share-KV ``v is k``."""
        if self.share == "qk":
            return self._split(self.q_proj(memory)), self._split(cast(nn.Linear, self.v_proj)(memory))
        k = self._split(cast(nn.Linear, self.k_proj)(memory))
        return k, (k if self.share == "kv" else self._split(cast(nn.Linear, self.v_proj)(memory)))

    def project_self(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(q, k, v)`` for self-attention, reusing the shared projection's output (ACORT Fig. 6)."""
        q = self.project_query(x)
        if self.share == "qk":
            return q, q, self._split(cast(nn.Linear, self.v_proj)(x))
        k, v = self.project_memory(x)
        return q, k, v

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attention over head-split tensors plus the output projection -> (B, T, d)."""
        out = scaled_dot_product(q, k, v, bias, self.dropout)
        return self.out_proj(out.transpose(1, 2).flatten(2))

    def cross_attend(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Cross-attention of the rows of ``x`` (R, T, d) to the keys/values (G, H, S, d_k) of G sources, G dividing R:
        source g serves the R/G consecutive rows g·R/G … (g+1)·R/G − 1 -> (R, T, d). ``bias`` broadcasts to
        (G, H, R/G·T, S).

        The beams of an image share its keys, so a decoder step can pass them once per image: each source and head
        then runs one (R/G·T × d_k)·(d_k × S) product instead of R/G one-row products (ONNX Runtime's CPU matmul pays
        per product; ``docs/decoding.md``). With G = R this is :meth:`project_query` + :meth:`attend` exactly.
        """
        rows, length = x.shape[0], x.shape[1]
        q = self.q_proj(x).reshape(k.shape[0], -1, self.heads, self.head_dim).transpose(1, 2)
        out = scaled_dot_product(q, k, v, bias, self.dropout)
        return self.out_proj(out.transpose(1, 2).reshape(rows, length, self.heads * self.head_dim))

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor | None = None, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Self-attention over ``x`` (B, T, d) when ``memory`` is None, else cross-attention to ``memory`` (B, S, d).

        ``bias`` broadcasts to (B, H, T, S): padding, causal and/or geometric terms.
        """
        if memory is None:
            q, k, v = self.project_self(x)
        else:
            q = self.project_query(x)
            k, v = self.project_memory(memory)
        return self.attend(q, k, v, bias)
