"""Pre-LN Transformer encoder/decoder layers and layer stacks with cross-layer sharing (ORT; ACORT §4.2–4.3).

Residual form is ``x + Dropout(f(LN(x)))`` with a final LayerNorm on each stack's output, as in the ORT reference.

Sharing: a :class:`LayerStack` owns each *unique* layer once (``unique``) and a layer map that says which unique
layer runs at each *position*. Positions that share a layer run the same module object, so its parameters,
gradients and optimiser state exist once — but anything that differs per position, above all the decoder's
self-attention cache, is indexed by position. (The ACORT reference keyed the cache by module and mixed keys from
different depths, so its cached decoding disagreed with teacher forcing.) Keeping the unique layers in one
``ModuleList`` instead of listing a module several times also keeps ``state_dict`` free of aliased entries, which
safetensors refuses to save.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn

from edgecap.workshop.models.layers.attention import MultiHeadAttention, causal_bias
from edgecap.workshop.models.layers.geometry import BoxAngles, GeometricBias
from edgecap.workshop.models.layers.layer_map import validate_layer_map
from edgecap.workshop.models.layers.norm import make_norm

__all__ = ["DecoderLayer", "EncoderLayer", "FeedForward", "LayerStack", "TransformerDecoder", "TransformerEncoder"]


class FeedForward(nn.Module):
    """``Linear(d, d_ff) -> ReLU -> Dropout -> Linear(d_ff, d)``."""

    def __init__(self, dim: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, d_ff)
        self.fc2 = nn.Linear(d_ff, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(torch.relu(self.fc1(x))))


class EncoderLayer(nn.Module):
    """Self-attention (optionally box-relational) + FFN, pre-LN.

    Args:
        geometry_dim: size of the box-relational embedding; when given, the layer owns its ``W_G``
            (:class:`GeometricBias`) and adds ``log ω`` to its attention logits (ORT §3.2).
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        d_ff: int,
        dropout: float,
        share: str | None,
        norm: str,
        geometry_dim: int | None = None,
        head_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(dim, heads, share, dropout, head_dim)
        self.geometric_bias = GeometricBias(geometry_dim, heads) if geometry_dim else None
        self.ffn = FeedForward(dim, d_ff, dropout)
        self.norm1, self.norm2 = make_norm(norm, dim), make_norm(norm, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, bias: torch.Tensor, geometry: BoxAngles | None = None) -> torch.Tensor:
        """``x`` (B, N, d); ``bias`` (B, 1, 1, N) key padding; ``geometry`` the box angles (:class:`BoxAngles`)."""
        if self.geometric_bias is not None:
            if geometry is None:
                raise ValueError("this encoder layer uses box-relational attention and needs the box embedding")
            bias = bias + self.geometric_bias(geometry).to(x.dtype)
        x = x + self.dropout(self.attn(self.norm1(x), bias=bias))
        return x + self.dropout(self.ffn(self.norm2(x)))


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder memory, FFN; pre-LN."""

    def __init__(
        self,
        dim: int,
        heads: int,
        d_ff: int,
        dropout: float,
        share: str | None,
        norm: str,
        head_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(dim, heads, share, dropout, head_dim)
        self.cross_attn = MultiHeadAttention(dim, heads, share, dropout, head_dim)
        self.ffn = FeedForward(dim, d_ff, dropout)
        self.norm1, self.norm2, self.norm3 = (make_norm(norm, dim) for _ in range(3))
        self.dropout = nn.Dropout(dropout)

    def _cross_and_ffn(
        self, x: torch.Tensor, cross_k: torch.Tensor, cross_v: torch.Tensor, memory_bias: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.dropout(self.cross_attn.cross_attend(self.norm2(x), cross_k, cross_v, memory_bias))
        return x + self.dropout(self.ffn(self.norm3(x)))

    def forward(
        self,
        x: torch.Tensor,
        cross_k: torch.Tensor,
        cross_v: torch.Tensor,
        memory_bias: torch.Tensor,
        self_bias: torch.Tensor,
    ) -> torch.Tensor:
        """Teacher-forced: ``x`` (B, T, d), ``cross_k/v`` (B, H, N, d_k), ``self_bias`` (1, 1, T, T) causal."""
        q, k, v = self.self_attn.project_self(self.norm1(x))
        x = x + self.dropout(self.self_attn.attend(q, k, v, self_bias))
        return self._cross_and_ffn(x, cross_k, cross_v, memory_bias)

    def step(
        self,
        x: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor | None,
        cross_k: torch.Tensor,
        cross_v: torch.Tensor,
        memory_bias: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One new position ``x`` (B, 1, d) against its cache ``past_k/v`` (B, H, T, d_k).

        Returns the layer output and the caches grown to T+1 (``v`` is None under Share-KV). The new position sees
        all cached positions and itself, which is exactly the causal mask's row, so no mask is needed.
        """
        q, k, v = self.self_attn.project_self(self.norm1(x))
        k_all = torch.cat((past_k, k), dim=2)
        v_all = torch.cat((past_v, v), dim=2) if past_v is not None else None
        x = x + self.dropout(self.self_attn.attend(q, k_all, k_all if v_all is None else v_all))
        return self._cross_and_ffn(x, cross_k, cross_v, memory_bias), k_all, v_all


class LayerStack(nn.Module):
    """Unique layers plus a layer map; iterating yields the module at each position (shared ones repeat)."""

    def __init__(self, layer_map: Sequence[int], make_layer: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.layer_map = validate_layer_map(layer_map)
        self.unique = nn.ModuleList(make_layer() for _ in range(max(self.layer_map) + 1))

    def __len__(self) -> int:
        return len(self.layer_map)

    def __getitem__(self, position: int) -> nn.Module:
        return self.unique[self.layer_map[position]]

    def __iter__(self) -> Iterator[nn.Module]:
        return (self.unique[i] for i in self.layer_map)

    @property
    def num_unique(self) -> int:
        return len(self.unique)


class TransformerEncoder(nn.Module):
    """Encoder stack with an optional box-relational bias computed by the caller once per forward.

    ``d_ff`` is one FFN width for every unique layer or one per unique layer (a structurally pruned model's);
    ``head_dim`` None means ``dim // heads``.
    """

    def __init__(
        self,
        layer_map: Sequence[int],
        dim: int,
        heads: int,
        d_ff: int | Sequence[int],
        dropout: float,
        share: str | None,
        norm: str,
        geometry_dim: int | None,
        head_dim: int | None = None,
    ) -> None:
        super().__init__()
        widths = iter(_widths(d_ff, layer_map))  # LayerStack makes the unique layers in index order
        self.layers = LayerStack(
            layer_map,
            lambda: EncoderLayer(dim, heads, next(widths), dropout, share, norm, geometry_dim, head_dim),
        )
        self.norm = make_norm(norm, dim)

    def forward(self, x: torch.Tensor, bias: torch.Tensor, geometry: BoxAngles | None = None) -> torch.Tensor:
        """``x`` (B, N, d), key-padding ``bias`` (B, 1, 1, N), box ``geometry`` (:class:`BoxAngles`) -> (B, N, d)."""
        for layer in self.layers:
            x = layer(x, bias, geometry)
        return self.norm(x)


class TransformerDecoder(nn.Module):
    """Decoder stack; teacher-forced :meth:`forward` and cached :meth:`step` compute the same function.

    Cross-attention keys/values are identical for all positions that share a layer (same weights, same memory), so
    :meth:`project_memory` computes and stores them once per *unique* layer. The self-attention cache is one entry
    per *position*.
    """

    def __init__(
        self,
        layer_map: Sequence[int],
        dim: int,
        heads: int,
        d_ff: int | Sequence[int],
        dropout: float,
        share: str | None,
        norm: str,
        head_dim: int | None = None,
    ) -> None:
        super().__init__()
        widths = iter(_widths(d_ff, layer_map))  # LayerStack makes the unique layers in index order
        self.layers = LayerStack(
            layer_map, lambda: DecoderLayer(dim, heads, next(widths), dropout, share, norm, head_dim)
        )
        self.norm = make_norm(norm, dim)
        self.heads, self.head_dim = heads, dim // heads if head_dim is None else head_dim
        self.separate_values = share != "kv"

    def project_memory(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Memory (B, N, d) -> ``cross_k`` (B, U, H, N, d_k) and ``cross_v`` (same, or None under Share-KV)."""
        ks, vs = [], []
        for layer in self.layers.unique:
            k, v = layer.cross_attn.project_memory(memory)
            ks.append(k)
            vs.append(v)
        cross_v = torch.stack(vs, dim=1) if self.separate_values else None
        return torch.stack(ks, dim=1), cross_v

    def empty_cache(self, like: torch.Tensor) -> torch.Tensor:
        """An empty self-attention cache (B, L, H, 0, d_k) with ``like``'s batch size, dtype and device."""
        return like.new_zeros(like.shape[0], len(self.layers), self.heads, 0, self.head_dim)

    def forward(
        self, x: torch.Tensor, cross_k: torch.Tensor, cross_v: torch.Tensor | None, memory_bias: torch.Tensor
    ) -> torch.Tensor:
        """Teacher-forced: embedded tokens ``x`` (B, T, d) -> hidden states (B, T, d)."""
        self_bias = causal_bias(x.shape[1], x)
        for pos, layer in enumerate(self.layers):
            u = self.layers.layer_map[pos]
            ck = _unique_entry(cross_k, u)
            x = layer(x, ck, ck if cross_v is None else _unique_entry(cross_v, u), memory_bias, self_bias)
        return self.norm(x)

    def step(
        self,
        x: torch.Tensor,
        self_k: torch.Tensor,
        self_v: torch.Tensor | None,
        cross_k: torch.Tensor,
        cross_v: torch.Tensor | None,
        memory_bias: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One position: ``x`` (B, 1, d), caches (B, L, H, T, d_k) -> hidden (B, 1, d), caches (B, L, H, T+1, d_k)."""
        new_k: list[torch.Tensor] = []
        new_v: list[torch.Tensor] = []
        for pos, layer in enumerate(self.layers):
            u = self.layers.layer_map[pos]
            ck = _unique_entry(cross_k, u)
            x, k, v = layer.step(
                x,
                self_k[:, pos],
                None if self_v is None else self_v[:, pos],
                ck,
                ck if cross_v is None else _unique_entry(cross_v, u),
                memory_bias,
            )
            new_k.append(k)
            if v is not None:
                new_v.append(v)
        return self.norm(x), torch.stack(new_k, dim=1), (torch.stack(new_v, dim=1) if new_v else None)


def _widths(d_ff: int | Sequence[int], layer_map: Sequence[int]) -> list[int]:
    """One FFN width per unique layer of ``layer_map``: ``d_ff`` repeated, or ``d_ff`` itself when it is a list."""
    unique = max(layer_map) + 1
    if isinstance(d_ff, int):
        return [d_ff] * unique
    widths = [int(w) for w in d_ff]
    if len(widths) != unique:
        raise ValueError(f"{len(widths)} FFN widths for {unique} unique layers")
    return widths


def _unique_entry(stacked: torch.Tensor, unique: int) -> torch.Tensor:
    """Entry ``unique`` of a per-unique-layer stack (B, U, ...).

    With one unique layer (every ACORT config) this is a ``squeeze``, which ONNX Runtime runs as a view of its input;
    ``stacked[:, u]`` exports as a ``Gather`` that copies the cross-attention keys (B·H·N·d_k floats) on every decoder
    step. Same values either way; U is fixed by the config, so the branch is resolved at export time.
    """
    return stacked.squeeze(1) if stacked.shape[1] == 1 else stacked[:, unique]
