"""Sinusoidal positions and the scaled token embedding of the ORT/ACORT decoder (Vaswani et al. §3.4–3.5)."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["SinusoidalPositions", "TokenEmbedding", "sinusoid_table"]


def sinusoid_table(length: int, dim: int) -> torch.Tensor:
    """``(length, dim)`` table with ``sin`` on even and ``cos`` on odd channels, wavelengths up to ``10000·2π``.

    Built in float64 and rounded once, so every consumer (teacher forcing, cached steps, exported graphs) reads
    identical values.
    """
    if dim % 2:
        raise ValueError(f"sinusoidal positions need an even dimension, got {dim}")
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    inv = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv)
    return table.float()


class SinusoidalPositions(nn.Module):
    """A fixed table of ``max_len`` positions; a non-persistent buffer, so checkpoints do not depend on ``max_len``."""

    def __init__(self, dim: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.register_buffer("table", sinusoid_table(max_len, dim), persistent=False)

    def forward(self, start: int, length: int) -> torch.Tensor:
        """Positions ``start .. start+length-1`` as ``(length, dim)``; ``start`` may be a symbolic size when exported.

        Raises:
            ValueError: (eager mode) the positions run past ``max_len``. Slicing would silently return fewer rows,
                and a ``(B, 1, d) + (0, d)`` broadcast would then yield an empty tensor instead of failing.
        """
        # Only plain ints are checked: under torch.export the sizes are symbolic and a Python comparison would
        # specialise the graph; the exporter bounds the cache length with its own dynamic-shape ranges.
        if isinstance(start, int) and isinstance(length, int) and start + length > self.max_len:
            raise ValueError(
                f"decoder position {start + length - 1} is past max_len={self.max_len}; "
                f"create the model with a larger max_len (positions are a fixed table)"
            )
        return self.table[start : start + length]


class TokenEmbedding(nn.Module):
    """``Embedding(V, d) · √d + positions`` followed by dropout (untied from the output projection, as in ORT)."""

    def __init__(self, vocab_size: int, dim: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.positions = SinusoidalPositions(dim, max_len)
        self.dropout = nn.Dropout(dropout)
        self.scale = math.sqrt(dim)

    @property
    def max_len(self) -> int:
        return self.positions.max_len

    def forward(self, tokens: torch.Tensor, start: int = 0, extra: torch.Tensor | None = None) -> torch.Tensor:
        """``tokens`` (B, T) long at positions ``start..start+T-1`` -> (B, T, d); ``extra`` (B, 1, d) is added to
        every token before dropout (the length-level embedding of LaBERT Eq. 2)."""
        x = self.embed(tokens) * self.scale + self.positions(start, tokens.shape[1]).to(self.embed.weight.dtype)
        return self.dropout(x if extra is None else x + extra)
