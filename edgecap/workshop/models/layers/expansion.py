"""Expansion layers of ExpansionNet v1/v2 (Hu et al.): Static, Block Static and Dynamic Expansion.

An expansion layer replaces self-attention. It distributes the ``L`` input vectors over a sequence of a different
length (the *forward* step), then reads them back to length ``L`` (the *backward* step), on two paths that see
``ReLU(M)`` and ``ReLU(−M)`` of one "length transformation matrix" ``M``, merged by a sigmoid selector
(v1 §3.3 Eq. 5–9; v2 §3.2 Eq. 4–9):

- ``M = Q_E Kᵀ / √d`` (v2 Eq. 5), ``Q_E`` the expansion queries;
- forward: ``R_i = Ψ(ReLU((−1)^i M), ε)``, ``F_i = R_i V_i + B_E`` (Eq. 7);
- backward: ``R'_i = Ψ(ReLU((−1)^i Mᵀ), ε)``, ``B_i = R'_i F_i`` (Eq. 8);
- selection: ``out = σ(S) ⊙ B_1 + (1 − σ(S)) ⊙ B_2`` (Eq. 9),

with the row normalisation ``Ψ(X, ε)_ij = x_ij / (Σ_z x_iz + ε)`` (v2 Eq. 6, v1 Eq. 5).

- **Static Expansion** (encoder): ``Q_E, B_E`` are ``N_E`` learned vectors (v1 Eq. 4).
- **Block Static Expansion** (v2 §3.2, Eq. 10): the queries of a group of lengths ``G = {N_E^1, ...}`` stacked in
  one matrix; the backward normalisation runs within each group's columns and the summed group reconstructions are
  scaled by ``1/|G|`` ("scaled by the inverse number of lengths in each block"). ``G = (N,)`` is v1's static layer.
- **Dynamic Expansion** (decoder): ``N_E`` slots per position, ``q_{t,n} = C x_t + E_Q[n]`` and
  ``β_{t,n} = C x_t + E_B[n]`` (v1 Eq. 3, v2 Eq. 4). Autoregressive masks (official code): slot
  ``(t, n)`` reads only ``x_s`` with ``s ≤ t`` (forward mask), output ``i`` reads only slots with ``t ≤ i`` (backward
  mask), normalised jointly over all its ``(i+1)·N_E`` slots. Hence past slots never change and
  :meth:`DynamicExpansion.step` caches them (as their forward coefficients), processing only the new token
  (``O(t·N_E·d)`` instead of ``O(t²·N_E·d)``).

Where this follows the official code rather than the paper's letter: the ε is 1e-9; dropout acts on ``M``; the
static backward step has no padding mask (padded rows are never read: the forward step masks them as columns and
the cross-attention masks them as keys). The sums of Ψ are plain ``ReduceSum`` ops so that an FP16 export can keep
exactly them in FP32 (``edgecap/workshop/export/specs/expansionnet.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["DEFAULT_EPS", "DynamicExpansion", "ExpansionCache", "StaticExpansion", "psi"]

#: The released ExpansionNet code's ε (a constructor default of its expansion layers).
DEFAULT_EPS = 1e-9

#: Per-layer cache of a Dynamic Expansion: ``c, k, v1, v2`` (B, T, d) and the forward coefficients ``r1, r2``
#: (B, T, N_E, T) of both paths (zero where the forward mask hides a position; see :meth:`DynamicExpansion.step`).
ExpansionCache = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def psi(x: torch.Tensor, eps: float, dim: int | tuple[int, ...] = -1) -> torch.Tensor:
    """``Ψ(X, ε)``: ``x / (Σ_dim x + ε)`` (v2 Eq. 6); all-zero rows stay zero instead of dividing by zero.

    The ``clamp_min(ε)`` changes nothing for the non-negative ``x`` it is used on, but the dynamo ONNX exporter's
    optimiser deletes an ``Add`` of a constant as small as 1e-9 (measured), leaving ``0 / 0 = NaN`` on all-zero
    rows; the clamp survives export and keeps the graph finite.
    """
    return x / (x.sum(dim=dim, keepdim=True) + eps).clamp_min(eps)


def _two_paths(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``ReLU(M)`` and ``ReLU(−M)`` (v2 Eq. 7: ``(−1)^i M``)."""
    return torch.relu(z), torch.relu(-z)


def _select(s: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``σ(S) ⊙ a + (1 − σ(S)) ⊙ b`` (v2 Eq. 9), ``s`` the selector projection ``S x``."""
    gate = torch.sigmoid(s)
    return gate * a + (1.0 - gate) * b


def _fused_projection(dim: int, parts: int) -> nn.Linear:
    """The layer's ``parts`` linear maps of ``x`` (C, K, V1, V2, S) as one ``Linear(d, parts·d)``: one matmul per
    call instead of ``parts`` (what bounds a cached step at small batch is the number of weight reads)."""
    return nn.Linear(dim, parts * dim)


def _init_fused(linear: nn.Linear, parts: int) -> None:
    """Xavier-uniform per block and PyTorch's default bias, i.e. exactly ``parts`` independent ``Linear(d, d)``."""
    dim = linear.in_features
    with torch.no_grad():
        for block in linear.weight.split(dim, dim=0):
            nn.init.xavier_uniform_(block)
        bound = 1.0 / math.sqrt(dim)
        linear.bias.uniform_(-bound, bound)


class _Expansion(nn.Module):
    """What both expansion layers hold: ``slots`` learned query vectors ``E_Q`` and bias vectors ``E_B``, the fused
    projection of ``parts`` linear maps of ``x`` and the dropout on ``M``.

    Args:
        dim: model width ``d``.
        slots: rows of ``E_Q``/``E_B`` (Σ G for the static layer, N_E for the dynamic one).
        parts: how many ``Linear(d, d)`` the fused projection stands for.
        dropout: dropout on ``M`` (the official code's placement).
        eps: ``ε`` of ``Ψ``.
    """

    def __init__(self, dim: int, slots: int, parts: int, dropout: float, eps: float) -> None:
        super().__init__()
        self.dim, self.eps, self._parts = dim, eps, parts
        self.query = nn.Parameter(torch.empty(slots, dim))  # E_Q (v2 Eq. 4; E_Q^G of Eq. 10)
        self.bias = nn.Parameter(torch.empty(slots, dim))  # E_B
        self.in_proj = _fused_projection(dim, parts)
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.query)
        nn.init.xavier_uniform_(self.bias)
        _init_fused(self.in_proj, self._parts)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The ``parts`` maps of ``x`` (the layer's docstring names them), each shaped like ``x``."""
        return self.in_proj(x).split(self.dim, dim=-1)


class StaticExpansion(_Expansion):
    """(Block) Static Expansion over a bidirectional sequence (encoder). ``project`` gives ``(K x, V1 x, V2 x, S x)``.

    Args:
        dim: model width ``d``.
        groups: the lengths ``G`` (v2 default ``(32, 64, 128, 256, 512)``; v1 ``(64,)``).
        dropout: dropout on ``M`` (the official code's placement).
        eps: ``ε`` of ``Ψ``.
    """

    def __init__(self, dim: int, groups: Sequence[int], dropout: float = 0.0, eps: float = DEFAULT_EPS) -> None:
        groups = tuple(int(g) for g in groups)
        if not groups or any(g < 1 for g in groups):
            raise ValueError(f"expansion groups must be positive lengths, got {groups}")
        super().__init__(dim, sum(groups), 4, dropout, eps)  # K, V1, V2, S
        self.groups = groups

    def _block_psi(self, x: torch.Tensor) -> torch.Tensor:
        """``Ψ`` within each group's columns of ``x`` (..., S) (the block backward normalisation)."""
        if len(self.groups) == 1:
            return psi(x, self.eps)
        return torch.cat([psi(part, self.eps) for part in torch.split(x, self.groups, dim=-1)], dim=-1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` (B, N, d), ``mask`` (B, N) bool (True = valid, None = all) -> (B, N, d)."""
        k, v1, v2, sel = self.project(x)
        z = self.dropout(torch.matmul(self.query, k.transpose(1, 2)) * (1.0 / math.sqrt(self.dim)))  # (B, S, N)
        pos, neg = _two_paths(z)
        if mask is not None:  # forward step: slots read only valid inputs
            keep = mask[:, None, :].to(z.dtype)
            pos_fw, neg_fw = pos * keep, neg * keep
        else:
            pos_fw, neg_fw = pos, neg
        f1 = torch.matmul(psi(pos_fw, self.eps), v1) + self.bias  # (B, S, d)
        f2 = torch.matmul(psi(neg_fw, self.eps), v2) + self.bias
        scale = 1.0 / len(self.groups)
        b1 = torch.matmul(self._block_psi(pos.transpose(1, 2)), f1) * scale  # (B, N, d)
        b2 = torch.matmul(self._block_psi(neg.transpose(1, 2)), f2) * scale
        return _select(sel, b1, b2)


class DynamicExpansion(_Expansion):
    """Causal Dynamic Expansion (decoder) with an exact per-token cache. ``project`` gives
    ``(C x, K x, V1 x, V2 x, S x)``.

    Args:
        dim: model width ``d``.
        slots: expansion coefficient ``N_E`` (slots per position; 16 in both papers).
        dropout: dropout on ``M``.
        eps: ``ε`` of ``Ψ``.
    """

    def __init__(self, dim: int, slots: int, dropout: float = 0.0, eps: float = DEFAULT_EPS) -> None:
        if slots < 1:
            raise ValueError(f"dynamic expansion needs >= 1 slot per position, got {slots}")
        super().__init__(dim, slots, 5, dropout, eps)  # C, K, V1, V2, S
        self.slots = slots
        self.scale = 1.0 / math.sqrt(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: ``x`` (B, T, d) -> (B, T, d); position ``i`` depends on ``x_≤i`` only."""
        length = x.shape[1]
        c, k, v1, v2, sel = self.project(x)
        q = c[:, :, None, :] + self.query  # (B, T, E, d): slot (t, n)
        beta = c[:, :, None, :] + self.bias
        # z[b, t, n, s] = q_{t,n} · k_s / √d
        z = self.dropout(torch.matmul(q.flatten(1, 2), k.transpose(1, 2)).unflatten(1, (length, self.slots)))
        z = z * self.scale
        pos, neg = _two_paths(z)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()  # [t, s]: s <= t
        fw = causal[None, :, None, :].to(z.dtype)
        f1 = torch.matmul(psi(pos * fw, self.eps), v1[:, None]) + beta  # (B, T, E, d)
        f2 = torch.matmul(psi(neg * fw, self.eps), v2[:, None]) + beta
        # Backward: output i reads slots (t, n) with t <= i, weights ReLU(±z[b, t, n, i]), Ψ over all (t, n).
        bw = causal[None, :, :, None].to(z.dtype)  # [i, t]: t <= i
        w1 = (pos.permute(0, 3, 1, 2) * bw).flatten(2)  # (B, T_i, T·E)
        w2 = (neg.permute(0, 3, 1, 2) * bw).flatten(2)
        b1 = torch.matmul(psi(w1, self.eps), f1.flatten(1, 2))
        b2 = torch.matmul(psi(w2, self.eps), f2.flatten(1, 2))
        return _select(sel, b1, b2)

    def empty_cache(self, like: torch.Tensor) -> ExpansionCache:
        """A length-0 cache for a batch like ``like`` (B, ..., d)."""
        batch = like.shape[0]
        row = like.new_zeros(batch, 0, self.dim)
        coefficients = like.new_zeros(batch, 0, self.slots, 0)
        return row, row, row, row, coefficients, coefficients

    def step(self, x: torch.Tensor, cache: ExpansionCache) -> tuple[torch.Tensor, ExpansionCache]:
        """One new position: ``x`` (B, 1, d) and the cache of the ``P`` earlier ones -> (B, 1, d), grown cache.

        The new slots ``(P, n)`` read ``x_0..x_P`` (forward); the output reads all ``(P+1)·N_E`` slots (backward).
        Earlier slots are reused unchanged: their forward rows never see later positions.

        What is cached of a slot is its forward coefficients ``R_i[t, n, :]`` (Eq. 7, zero for ``s > t``), not the
        slot vector ``F_i[t, n] = R_i[t, n, :] V_i + c_t + E_B[n]`` itself. The backward read-out (Eq. 8) is linear in
        the slots, so with the new weights ``W_i`` (B, P+1, N_E)

            ``Σ_{t,n} W[t,n] F[t,n] = (Σ_{t,n} W[t,n] R[t,n,:]) V + (Σ_n W[t,n])_t C + (Σ_t W[t,n])_n E_B``

        reads the same value from ``(P+1)·N_E·(P+1)`` cached numbers per path instead of ``(P+1)·N_E·d``: at
        ``d = 512, N_E = 16`` and 20 positions, 25× less cache to store, append to, read and reorder per beam every
        step, which is what bounds a cached step (see ``docs/expansionnet.md``).
        """
        c_new, k_new, v1_new, v2_new, sel = self.project(x)
        c = torch.cat((cache[0], c_new), dim=1)
        k = torch.cat((cache[1], k_new), dim=1)
        v1 = torch.cat((cache[2], v1_new), dim=1)
        v2 = torch.cat((cache[3], v2_new), dim=1)
        q_new = c_new[:, 0, None, :] + self.query  # (B, E, d)
        z_new = torch.matmul(q_new, k.transpose(1, 2)) * self.scale  # (B, E, P+1)
        pos, neg = _two_paths(z_new)
        r1 = _append_position(cache[4], psi(pos, self.eps))
        r2 = _append_position(cache[5], psi(neg, self.eps))
        # Backward scores of every slot against the new key: (c_t + E_Q[n]) · k = c_t · k + E_Q[n] · k, so the
        # (P+1)·E slot queries are never materialised: O((P+1)·d + E·d) instead of O((P+1)·E·d).
        key = k_new.transpose(1, 2)  # (B, d, 1)
        zb = (torch.matmul(c, key) + torch.matmul(self.query, key).transpose(1, 2)) * self.scale  # (B, P+1, E)
        w1, w2 = _two_paths(zb)
        b1 = self._read_back(psi(w1, self.eps, dim=(1, 2)), r1, v1, c)
        b2 = self._read_back(psi(w2, self.eps, dim=(1, 2)), r2, v2, c)
        return _select(sel, b1, b2), (c, k, v1, v2, r1, r2)

    def _read_back(self, w: torch.Tensor, r: torch.Tensor, v: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """``Σ_{t,n} w[t,n] F[t,n]`` (B, 1, d) from normalised weights ``w`` (B, P+1, E), coefficients ``r``
        (B, P+1, E, P+1), values ``v`` and conditionings ``c`` (B, P+1, d); see :meth:`step`."""
        through_values = torch.matmul(w.flatten(1)[:, None], r.flatten(1, 2))  # (B, 1, P+1)
        return (
            torch.matmul(through_values, v)
            + torch.matmul(w.sum(dim=2)[:, None], c)
            + torch.matmul(w.sum(dim=1)[:, None], self.bias)
        )


def _append_position(r: torch.Tensor, r_new: torch.Tensor) -> torch.Tensor:
    """Forward coefficients (B, P, E, P) of the past slots plus the new position's (B, E, P+1) -> (B, P+1, E, P+1).

    Past slots never read the new position (forward mask), so their new column is zero.
    """
    return torch.cat((nn.functional.pad(r, (0, 1)), r_new[:, None]), dim=1)
