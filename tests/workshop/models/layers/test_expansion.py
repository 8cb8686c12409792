"""Expansion layers against the papers' formulas: hand-computed cases, a loop-by-loop reference, masks, groups."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from edgecap.workshop.models.layers.expansion import DynamicExpansion, StaticExpansion, psi


def _set_projections(layer: nn.Module, *scales: float) -> None:
    """d = 1: the fused projection's maps (C,) K, V1, V2, S become ``x -> scale · x``."""
    with torch.no_grad():
        layer.in_proj.weight.copy_(torch.tensor(scales)[:, None])
        layer.in_proj.bias.zero_()


# -- Ψ (v2 Eq. 6) ---------------------------------------------------------------------------------------------------
def test_psi_normalises_rows_and_keeps_zero_rows_zero() -> None:
    x = torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    torch.testing.assert_close(psi(x, 1e-9), torch.tensor([[0.25, 0.75], [0.0, 0.0]]))
    torch.testing.assert_close(psi(torch.tensor([[1.0, 1.0]]), 0.5), torch.tensor([[0.4, 0.4]]))  # x / (2 + 0.5)


# -- hand-checkable cases (d = 1, identity projections, selector σ(0) = 1/2) -------------------------------------
def test_static_expansion_by_hand_with_and_without_mask() -> None:
    layer = StaticExpansion(1, groups=(1,))
    _set_projections(layer, 1.0, 1.0, 1.0, 0.0)  # K, V1, V2 identity; S = 0
    with torch.no_grad():
        layer.query.fill_(1.0)
        layer.bias.zero_()
    x = torch.tensor([[[2.0], [-1.0]]])
    # M = [2, -1]; F1 = Ψ([2, 0])·x = 2, F2 = Ψ([0, 1])·x = -1; backward rows Ψ over the single slot: [1, 0] / [0, 1]
    torch.testing.assert_close(layer(x), torch.tensor([[[1.0], [-0.5]]]))
    # Masking x_1 leaves the negative path of the slot with no valid input: F2 = 0 + bias = 0
    torch.testing.assert_close(layer(x, torch.tensor([[True, False]])), torch.tensor([[[1.0], [0.0]]]))


def test_dynamic_expansion_by_hand() -> None:
    layer = DynamicExpansion(1, slots=1)
    _set_projections(layer, 1.0, 1.0, 1.0, 1.0, 0.0)  # C, K, V1, V2 identity; S = 0
    with torch.no_grad():
        layer.query.zero_()
        layer.bias.zero_()
    x = torch.tensor([[[1.0], [-2.0]]])
    # q_t = β_t = x_t, M[t, s] = x_t x_s = [[1, -2], [-2, 4]].
    # Forward (s <= t): F1_0 = 1 + 1 = 2, F2_0 = 0 + 1 = 1; F1_1 = Ψ([0, 4])·x - 2 = -4, F2_1 = Ψ([2, 0])·x - 2 = -1.
    # Backward (t <= i): y_0 = (F1_0 + 0) / 2 = 1; y_1 = (Ψ([0, 4])·F1 + Ψ([2, 0])·F2) / 2 = (-4 + 1) / 2.
    expected = torch.tensor([[[1.0], [-1.5]]])
    torch.testing.assert_close(layer(x), expected)
    cache = layer.empty_cache(x)
    y0, cache = layer.step(x[:, :1], cache)
    y1, cache = layer.step(x[:, 1:], cache)
    torch.testing.assert_close(torch.cat((y0, y1), 1), expected)
    # The cached forward coefficients: R1 = [[Ψ([1])], [Ψ([0, 4])]], R2 = [[Ψ([0])], [Ψ([2, 0])]], zero past t.
    torch.testing.assert_close(cache[4][0, :, 0], torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    torch.testing.assert_close(cache[5][0, :, 0], torch.tensor([[0.0, 0.0], [1.0, 0.0]]))


# -- loop-by-loop references of the formulas ------------------------------------------------------------------------
def _reference_static(layer: StaticExpansion, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Eq. 5-10 written element by element for one image x (N, d) and mask (N,)."""
    n, d = x.shape
    k, v1, v2, s_proj = layer.project(x)
    v = (v1, v2)
    z = [[float(layer.query[s] @ k[j]) / math.sqrt(d) for j in range(n)] for s in range(sum(layer.groups))]
    outs = []
    for path, sign in enumerate((1.0, -1.0)):
        f = []
        for s in range(len(z)):
            w = [max(sign * z[s][j], 0.0) if mask[j] else 0.0 for j in range(n)]
            total = sum(w) + layer.eps
            f.append(sum(w[j] / total * v[path][j] for j in range(n)) + layer.bias[s])
        out = []
        for i in range(n):
            acc, start = torch.zeros(d), 0
            for g in layer.groups:
                w = [max(sign * z[s][i], 0.0) for s in range(start, start + g)]
                total = sum(w) + layer.eps
                acc = acc + sum(w[m] / total * f[start + m] for m in range(g))
                start += g
            out.append(acc / len(layer.groups))
        outs.append(torch.stack(out))
    sel = torch.sigmoid(s_proj)
    return sel * outs[0] + (1 - sel) * outs[1]


def _reference_dynamic(layer: DynamicExpansion, x: torch.Tensor) -> torch.Tensor:
    """The dynamic expansion for one sequence x (T, d), with the forward/backward causal masks as loops."""
    t_len, d = x.shape
    c, k, v1, v2, s_proj = layer.project(x)
    v = (v1, v2)
    e = layer.slots
    q = [[c[t] + layer.query[n] for n in range(e)] for t in range(t_len)]

    def z(t: int, n: int, s: int) -> float:
        return float(q[t][n] @ k[s]) / math.sqrt(d)

    outs = []
    for path, sign in enumerate((1.0, -1.0)):
        f = {}
        for t in range(t_len):
            for n in range(e):
                w = [max(sign * z(t, n, s), 0.0) for s in range(t + 1)]  # forward mask: s <= t
                total = sum(w) + layer.eps
                f[t, n] = sum(w[s] / total * v[path][s] for s in range(t + 1)) + c[t] + layer.bias[n]
        out = []
        for i in range(t_len):
            slots = [(t, n) for t in range(i + 1) for n in range(e)]  # backward mask: t <= i
            w = [max(sign * z(t, n, i), 0.0) for t, n in slots]
            total = sum(w) + layer.eps
            out.append(sum(w[j] / total * f[slot] for j, slot in enumerate(slots)))
        outs.append(torch.stack(out))
    sel = torch.sigmoid(s_proj)
    return sel * outs[0] + (1 - sel) * outs[1]


@torch.no_grad()
def test_block_static_expansion_matches_the_formula_with_groups_and_mask() -> None:
    torch.manual_seed(0)
    layer = StaticExpansion(6, groups=(2, 3, 4)).eval()
    x = torch.randn(2, 5, 6)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    out = layer(x, mask)
    for b in range(2):
        torch.testing.assert_close(out[b], _reference_static(layer, x[b], mask[b]), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_dynamic_expansion_matches_the_formula_and_its_cached_steps() -> None:
    torch.manual_seed(1)
    layer = DynamicExpansion(6, slots=3).eval()
    x = torch.randn(2, 4, 6)
    out = layer(x)
    for b in range(2):
        torch.testing.assert_close(out[b], _reference_dynamic(layer, x[b]), atol=1e-5, rtol=1e-5)
    cache, steps = layer.empty_cache(x), []
    for t in range(x.shape[1]):
        y, cache = layer.step(x[:, t : t + 1], cache)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, 1), out, atol=1e-5, rtol=0)
    assert cache[4].shape == (2, 4, 3, 4)  # (B, T, N_E, T) forward coefficients


@torch.no_grad()
def test_dynamic_expansion_is_causal() -> None:
    torch.manual_seed(2)
    layer = DynamicExpansion(8, slots=4).eval()
    x = torch.randn(1, 6, 8)
    changed = x.clone()
    changed[:, 3:] = torch.randn(1, 3, 8)
    torch.testing.assert_close(layer(changed)[:, :3], layer(x)[:, :3])
    assert (layer(changed)[:, 3:] - layer(x)[:, 3:]).abs().max() > 1e-3


@torch.no_grad()
def test_block_groups_are_normalised_separately_and_averaged() -> None:
    """G = {2, 2} with the same two queries in both groups reconstructs exactly what G = {2} does: each group's
    backward weights sum to 1 on their own, and the 1/|G| scaling averages identical reconstructions."""
    torch.manual_seed(3)
    single = StaticExpansion(4, groups=(2,)).eval()
    double = StaticExpansion(4, groups=(2, 2)).eval()
    repeated = {"query": single.query.repeat(2, 1), "bias": single.bias.repeat(2, 1)}
    double.load_state_dict({**single.state_dict(), **repeated})
    x = torch.randn(3, 5, 4)
    torch.testing.assert_close(double(x), single(x))
    # without the 1/|G| scaling the sum would double the reconstruction
    assert not torch.allclose(double(x), single(x) * 2, atol=1e-3)


def test_fused_projection_is_initialised_like_separate_maps() -> None:
    torch.manual_seed(4)
    layer = DynamicExpansion(64, slots=2)
    bound = math.sqrt(6.0 / (64 + 64))  # xavier-uniform of one (d, d) map, not of the (5d, d) stack
    for block in layer.in_proj.weight.split(64, dim=0):
        assert block.abs().max() <= bound and block.abs().max() > 0.9 * bound
    assert [p.shape for p in layer.project(torch.zeros(1, 3, 64))] == [(1, 3, 64)] * 5


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        StaticExpansion(4, groups=(2, 0))
    with pytest.raises(ValueError, match="slot"):
        DynamicExpansion(4, slots=0)
