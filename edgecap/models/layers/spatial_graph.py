"""Spatial graph of the Image Transformer (He et al., "Image Captioning through Image Transformer", ACCV 2020, §3.2)
and the multi-scale grid that gives a feature grid nested cells.

Relations (Eq. 5, ε = 0.9): for a query box ``l`` and a key box ``m``,
``Ω_p[l, m] = 1`` when ``Area(l ∩ m) / Area(l) >= ε`` and ``Area(l ∩ m) / Area(l) > Area(l ∩ m) / Area(m)``
(``l`` lies inside ``m``: ``m`` is ``l``'s parent), ``Ω_c[l, m] = Ω_p[m, l]`` and ``Ω_n = 1 − Ω_p − Ω_c``, so the
three masks sum to one for every pair. Identical boxes (and every box with itself) are neighbours.

Everything is tensor arithmetic on the boxes that come with the features (no per-image files, no data-dependent
Python branches), so it runs on any device and exports to ONNX. Departure from the paper's released code, on purpose:
each side of the intersection is clamped at zero, so two boxes apart on both axes have no overlap (the released code
multiplies two negative sides into a positive "intersection" and can label such boxes parent/child).

Multi-scale grid (edgecap's addition, ``docs/image-transformer.md``): the cells of a backbone grid tile the image, so
no cell contains another and Eq. 5 would find only neighbours. :func:`multiscale_cells` adds coarser cells (e.g. a
3×3 and a 1×1 tiling): each is the mean of the input cells whose centres fall in its tile and its box is the union of
their boxes, so every member is its child and the coarse cell its parent.
"""

from __future__ import annotations

import torch

__all__ = ["OVERLAP_EPS", "RELATIONS", "multiscale_cells", "spatial_relations"]

#: ε of Eq. 5.
OVERLAP_EPS = 0.9
#: Order of the relation axis of :func:`spatial_relations`.
RELATIONS = ("parent", "neighbour", "child")
#: Smallest box area used as a denominator, so degenerate (zero-area) boxes never divide by zero.
_MIN_AREA = 1e-8


def spatial_relations(boxes: torch.Tensor, eps: float = OVERLAP_EPS) -> torch.Tensor:
    """Relation masks ``(B, 3, N, N)`` (parent, neighbour, child; 0/1 in ``boxes.dtype``) of boxes ``(B, N, 4)``.

    Row ``l`` is the query box, column ``m`` the key box; boxes are ``(x1, y1, x2, y2)``. See the module docstring
    for Eq. 5; zero-area boxes contain nothing and are contained by nothing (all neighbours).
    """
    x1, y1, x2, y2 = boxes.unbind(-1)
    # ReLU is the clamp at zero (a constant-free op: a 0.0 constant shared with the float16 part of an exported graph
    # would get one type for two uses)
    width = torch.relu(torch.minimum(x2[:, :, None], x2[:, None, :]) - torch.maximum(x1[:, :, None], x1[:, None, :]))
    height = torch.relu(torch.minimum(y2[:, :, None], y2[:, None, :]) - torch.maximum(y1[:, :, None], y1[:, None, :]))
    inter = width * height  # (B, N, N)
    area = (torch.relu(x2 - x1) * torch.relu(y2 - y1)).clamp(min=_MIN_AREA)
    inside_key = inter / area[:, :, None]  # share of the query l inside the key m
    inside_query = inter / area[:, None, :]  # share of the key m inside the query l
    parent = (inside_key >= eps) & (inside_key > inside_query)
    child = (inside_query >= eps) & (inside_query > inside_key)
    parent_f, child_f = parent.to(boxes.dtype), child.to(boxes.dtype)
    return torch.stack((parent_f, 1.0 - parent_f - child_f, child_f), dim=1)


def _tile_membership(boxes: torch.Tensor, valid: torch.Tensor, scale: int) -> torch.Tensor:
    """(B, scale², N) bool: cell ``n`` (valid, centre in tile ``t`` of a ``scale × scale`` tiling) belongs to ``t``."""
    centre = (boxes[..., :2] + boxes[..., 2:]) * 0.5  # (B, N, 2)
    # clamp after the cast: an integer Clip keeps float constants out of the float16 export
    index = torch.floor(centre * scale).to(torch.long).clamp(0, scale - 1)
    tile = index[..., 1] * scale + index[..., 0]  # row-major (y, x)
    tiles = torch.arange(scale * scale, device=boxes.device)
    return (tile[:, None, :] == tiles[None, :, None]) & valid[:, None, :]


def multiscale_cells(
    features: torch.Tensor, boxes: torch.Tensor, mask: torch.Tensor | None, scales: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Append coarse cells to ``features`` (B, N, C), ``boxes`` (B, N, 4), ``mask`` (B, N) (True = valid; None = all).

    For each ``s`` in ``scales`` the image is tiled ``s × s``; a tile's cell is the mean of the valid input cells whose
    box centres fall in it, with the union of their boxes. A tile with no member is padding (mask False, zero box).

    Returns:
        ``(features, boxes, mask)`` with ``N + Σ s²`` entries, the input ones first.
    """
    valid = torch.ones_like(features[..., 0], dtype=torch.bool) if mask is None else mask
    out_features, out_boxes, out_mask = [features], [boxes], [valid]
    for scale in scales:
        member = _tile_membership(boxes, valid, scale)  # (B, T, N)
        weight = member.to(features.dtype)
        count = weight.sum(-1, keepdim=True)  # (B, T, 1)
        out_features.append(torch.matmul(weight, features) / torch.maximum(count, torch.ones_like(count)))
        # union box: min of the members' (x1, y1), max of their (x2, y2); 2 and -1 are outside every normalised box
        big = torch.full_like(boxes[..., 0], 2.0)[:, None, :]
        # top-1 rather than amin/amax: ONNX Runtime's symbolic shape inference (INT8 calibration) cannot type the
        # ReduceMin/ReduceMax the exporter writes
        lows = [torch.where(member, boxes[..., i][:, None, :], big).topk(1, -1, largest=False)[0] for i in (0, 1)]
        highs = [torch.where(member, boxes[..., i][:, None, :], -big).topk(1, -1)[0] for i in (2, 3)]
        union = torch.cat((*lows, *highs), dim=-1)
        has = member.sum(-1) > 0  # an integer count: no float constant shared with the float16 part of an export
        out_boxes.append(union * has[..., None].to(union.dtype))  # empty tiles: a zero box (finite ±2 times 0)
        out_mask.append(has)
    return torch.cat(out_features, 1), torch.cat(out_boxes, 1), torch.cat(out_mask, 1)
