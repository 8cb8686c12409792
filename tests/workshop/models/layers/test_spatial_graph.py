"""Spatial graph (Image Transformer Eq. 5) on hand-made boxes, and the multi-scale grid's nested cells."""

from __future__ import annotations

import pytest
import torch

from edgecap.workshop.models.layers.spatial_graph import RELATIONS, multiscale_cells, spatial_relations

P, N, C = (RELATIONS.index(r) for r in ("parent", "neighbour", "child"))


def relation(a: list[float], b: list[float]) -> str:
    """The label of key ``b`` seen from query ``a``."""
    masks = spatial_relations(torch.tensor([[a, b]]))[0, :, 0, 1]
    assert masks.sum() == 1.0
    return RELATIONS[int(masks.argmax())]


def test_nested_boxes_are_parent_and_child() -> None:
    big, small = [0.0, 0.0, 1.0, 1.0], [0.2, 0.2, 0.4, 0.4]
    assert relation(small, big) == "parent"  # the big box is the small one's parent
    assert relation(big, small) == "child"


@pytest.mark.parametrize(("shift", "expected"), [(0.01, "parent"), (0.05, "neighbour")])
def test_overlap_above_and_below_eps(shift: float, expected: str) -> None:
    """A 0.2-wide box sticking out of a big one by ``shift``: 95 % inside is above ε = 0.9,
    75 % is below."""
    inner = [0.9 - 0.2 + shift, 0.1, 0.9 + shift, 0.3]
    big = [0.0, 0.0, 0.9, 0.9]
    assert relation(inner, big) == expected
    assert relation(big, inner) == {"parent": "child", "neighbour": "neighbour"}[expected]


def test_disjoint_on_both_axes_is_neighbour() -> None:
    """The released code multiplies two negative sides into a positive 'intersection'; here the overlap is 0."""
    a, b = [0.0, 0.0, 0.1, 0.1], [0.5, 0.5, 0.9, 0.9]
    assert relation(a, b) == "neighbour" and relation(b, a) == "neighbour"
    # the unclamped product would be (0.1 - 0.5) * (0.1 - 0.5) = 0.16 >= 0.9 * area(a) = 0.009: a "parent" there
    assert (0.1 - 0.5) * (0.1 - 0.5) >= 0.9 * 0.01


def test_identical_boxes_and_self_are_neighbours() -> None:
    box = [0.1, 0.2, 0.5, 0.6]
    assert relation(box, box) == "neighbour"
    masks = spatial_relations(torch.tensor([[box, [0.0, 0.0, 1.0, 1.0]]]))
    assert torch.equal(torch.diagonal(masks[0, N]), torch.ones(2))


def test_masks_are_one_hot_and_child_is_parent_transposed() -> None:
    g = torch.Generator().manual_seed(0)
    corner = torch.rand(3, 12, 2, generator=g) * 0.7
    boxes = torch.cat((corner, corner + 0.05 + torch.rand(3, 12, 2, generator=g) * 0.3), -1)
    boxes[:, 1] = torch.tensor([0.0, 0.0, 1.0, 1.0])  # a parent of every other box
    boxes[:, 2] = boxes[:, 3]  # identical pair
    boxes[:, 4] = torch.tensor([0.3, 0.3, 0.3, 0.5])  # zero area
    masks = spatial_relations(boxes)
    assert masks.shape == (3, 3, 12, 12)
    assert torch.equal(masks.sum(1), torch.ones(3, 12, 12))
    assert set(masks.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(masks[:, C], masks[:, P].transpose(1, 2))
    assert masks[:, P, 0, 1].eq(1).all() and masks[:, C, 1, 0].eq(1).all()
    assert masks[:, N, 2, 3].eq(1).all() and masks[:, N, 4].eq(1).all()


def grid(side: int) -> torch.Tensor:
    edges = torch.linspace(0, 1, side + 1)
    y1, x1 = torch.meshgrid(edges[:-1], edges[:-1], indexing="ij")
    y2, x2 = torch.meshgrid(edges[1:], edges[1:], indexing="ij")
    return torch.stack((x1, y1, x2, y2), -1).reshape(1, side * side, 4)


def test_multiscale_grid_has_parents_and_children() -> None:
    boxes = grid(7)
    features = torch.arange(49.0).reshape(1, 49, 1)
    feats, out_boxes, mask = multiscale_cells(features, boxes, None, (3, 1))
    assert feats.shape == (1, 59, 1) and out_boxes.shape == (1, 59, 4) and mask.all()
    assert torch.allclose(feats[0, -1], features.mean(1)[0])  # the 1x1 cell is the mean of all cells
    assert torch.allclose(out_boxes[0, -1], torch.tensor([0.0, 0.0, 1.0, 1.0]))
    # top-left 3x3 tile: centres 1/14 and 3/14 fall in [0, 1/3) -> the 2x2 top-left cells, box [0, 2/7]^2
    assert torch.allclose(out_boxes[0, 49], torch.tensor([0, 0, 2 / 7, 2 / 7]))
    assert torch.allclose(feats[0, 49, 0], torch.tensor([0.0, 1.0, 7.0, 8.0]).mean())
    masks = spatial_relations(out_boxes)[0]
    assert masks[P, :49, 49:].sum(1).eq(2).all()  # every 7x7 cell has one 3x3 parent and the 1x1 parent
    assert masks[C, 49:58, :49].sum().item() == 49  # the 3x3 tiles partition the 7x7 cells
    assert masks[P, :49, :49].sum() == 0 and masks[P, 49:58, 49:58].sum() == 0  # no nesting within one scale


def test_multiscale_respects_padding() -> None:
    boxes = grid(2).repeat(2, 1, 1)
    features = torch.ones(2, 4, 3)
    mask = torch.tensor([[True] * 4, [True, False, False, False]])
    feats, out_boxes, out_mask = multiscale_cells(features, boxes, mask, (2,))
    assert out_mask[0].all()
    assert out_mask[1].tolist() == [True, False, False, False, True, False, False, False]
    assert torch.equal(out_boxes[1, 5:], torch.zeros(3, 4))
