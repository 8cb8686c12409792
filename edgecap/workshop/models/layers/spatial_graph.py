"""Spatial graph of the Image Transformer (He et al., "Image Captioning through Image Transformer", ACCV 2020, §3.2)
and the multi-scale grid that gives a feature grid nested cells.

Relations (Eq. 5, ε = 0.9): for a query box ``l`` and a key box ``m``,
``Ω_p[l, m] = 1`` when ``Area(l ∩ m) / Area(l) >= ε`` and ``Area(l ∩ m) / Area(l) > Area(l ∩ m) / Area(m)``
(``l`` lies inside ``m``: ``m`` is ``l``'s parent), ``Ω_c[l, m] = Ω_p[m, l]`` and ``Ω_n = 1 − Ω_p − Ω_c``, so the
three masks sum to one for every pair. Identical boxes (and every box with itself) are neighbours.

Everything is tensor arithmetic on the boxes that come with the features (no per-image files, no data-dependent
Python branches), so it runs on any device and exports to ONNX. Labels (``labels``, :data:`RELATION_LABELS`):

- ``"paper"`` (the default): each side of the intersection is clamped at zero, so two boxes apart on both axes have
  no overlap and are neighbours, as Eq. 5 defines ``Area(l ∩ m)``;
- ``"official"``: the released code's offline labelling, which multiplies the two sides without a check. Two boxes
  apart on both axes (both sides negative) then get a positive "intersection" and can be labelled parent/child;
  one negative side gives a negative one (neighbours, as with the clamp). Only for importing its checkpoints.

Multi-scale grid (edgecap's addition, ``docs/image-transformer.md``): the cells of a backbone grid tile the image, so
no cell contains another and Eq. 5 would find only neighbours. :func:`multiscale_cells` adds coarser cells (e.g. a
3×3 and a 1×1 tiling): each is the mean of the input cells whose centres fall in its tile and its box is the union of
their boxes, so every member is its child and the coarse cell its parent. Detector regions already nest, so the cells
are meant for grids only: :func:`tiles_image` tells a grid (its cells partition the image) from regions, per image.
"""

from __future__ import annotations

import torch

__all__ = ["OVERLAP_EPS", "RELATIONS", "RELATION_LABELS", "multiscale_cells", "spatial_relations", "tiles_image"]

#: ε of Eq. 5.
OVERLAP_EPS = 0.9
#: Order of the relation axis of :func:`spatial_relations`.
RELATIONS = ("parent", "neighbour", "child")
#: How the intersection of Eq. 5 is computed: clamped per side (``"paper"``) or as the released code does it.
RELATION_LABELS = ("paper", "official")
#: Slack of :func:`tiles_image` on normalised areas: a float32 grid is exact to ~1e-6, detector regions are far off.
_TILING_TOL = 1e-3
#: Smallest box area used as a denominator, so degenerate (zero-area) boxes never divide by zero.
_MIN_AREA = 1e-8


def spatial_relations(boxes: torch.Tensor, eps: float = OVERLAP_EPS, labels: str = "paper") -> torch.Tensor:
    """Relation masks ``(B, 3, N, N)`` (parent, neighbour, child; 0/1 in ``boxes.dtype``) of boxes ``(B, N, 4)``.

    Row ``l`` is the query box, column ``m`` the key box; boxes are ``(x1, y1, x2, y2)``. See the module docstring
    for Eq. 5 and ``labels``; zero-area boxes contain nothing and are contained by nothing (all neighbours).
    """
    if labels not in RELATION_LABELS:
        raise ValueError(f"unknown relation labels {labels!r}; choose one of {RELATION_LABELS}")
    x1, y1, x2, y2 = boxes.unbind(-1)
    width = torch.minimum(x2[:, :, None], x2[:, None, :]) - torch.maximum(x1[:, :, None], x1[:, None, :])
    height = torch.minimum(y2[:, :, None], y2[:, None, :]) - torch.maximum(y1[:, :, None], y1[:, None, :])
    if labels == "paper":
        # ReLU is the clamp at zero (a constant-free op: a 0.0 constant shared with the float16 part of an exported
        # graph would get one type for two uses)
        width, height = torch.relu(width), torch.relu(height)
    inter = width * height  # (B, N, N)
    area = (torch.relu(x2 - x1) * torch.relu(y2 - y1)).clamp(min=_MIN_AREA)
    inside_key = inter / area[:, :, None]  # share of the query l inside the key m
    inside_query = inter / area[:, None, :]  # share of the key m inside the query l
    parent = (inside_key >= eps) & (inside_key > inside_query)
    child = (inside_query >= eps) & (inside_query > inside_key)
    parent_f, child_f = parent.to(boxes.dtype), child.to(boxes.dtype)
    return torch.stack((parent_f, 1.0 - parent_f - child_f, child_f), dim=1)


def tiles_image(boxes: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``(B,)`` bool: the valid boxes of each image partition the unit square, as a backbone grid's cells do.

    True when the valid boxes' areas sum to 1 and no two of them overlap (within ``_TILING_TOL``). Detector regions
    overlap and nest, so they are never taken for a grid; pixel-unit boxes never are either. Tensor ops only (no
    data-dependent Python branch), so the choice is made per image inside an exported graph. Comparisons are written
    as ``Greater`` so that the float16 export keeps their inputs in float32 (the spatial graph's rule).
    """
    x1, y1, x2, y2 = boxes.unbind(-1)
    valid = torch.ones_like(x1) if mask is None else mask.to(boxes.dtype)
    width = torch.relu(torch.minimum(x2[:, :, None], x2[:, None, :]) - torch.maximum(x1[:, :, None], x1[:, None, :]))
    height = torch.relu(torch.minimum(y2[:, :, None], y2[:, None, :]) - torch.maximum(y1[:, :, None], y1[:, None, :]))
    pair = valid[:, :, None] * valid[:, None, :]
    area = (torch.relu(x2 - x1) * torch.relu(y2 - y1) * valid).sum(-1)  # Σ areas; also Σ of the diagonal overlaps
    overlap = (width * height * pair).sum((-2, -1)) - area  # Σ over distinct pairs
    # |Σ − 1| > tol as two comparisons with their own constants: a 1.0 shared with the float16 part of an exported
    # graph would get one type for two uses
    off_total = (area > 1.0 + _TILING_TOL) | (-area > _TILING_TOL - 1.0)
    return ~(off_total | (overlap > _TILING_TOL))


def _tile_membership(boxes: torch.Tensor, valid: torch.Tensor, scale: int) -> torch.Tensor:
    """(B, scale², N) bool: cell ``n`` (valid, centre in tile ``t`` of a ``scale × scale`` tiling) belongs to ``t``."""
    centre = (boxes[..., :2] + boxes[..., 2:]) * 0.5  # (B, N, 2)
    # clamp after the cast: an integer Clip keeps float constants out of the float16 export
    index = torch.floor(centre * scale).to(torch.long).clamp(0, scale - 1)
    tile = index[..., 1] * scale + index[..., 0]  # row-major (y, x)
    tiles = torch.arange(scale * scale, device=boxes.device)
    return (tile[:, None, :] == tiles[None, :, None]) & valid[:, None, :]


def multiscale_cells(
    features: torch.Tensor,
    boxes: torch.Tensor,
    mask: torch.Tensor | None,
    scales: tuple[int, ...],
    active: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Append coarse cells to ``features`` (B, N, C), ``boxes`` (B, N, 4), ``mask`` (B, N) (True = valid; None = all).

    For each ``s`` in ``scales`` the image is tiled ``s × s``; a tile's cell is the mean of the valid input cells whose
    box centres fall in it, with the union of their boxes. A tile with no member is padding (mask False, zero box).
    ``active`` (B,) bool (None = every image): the images that get coarse cells; the others' coarse cells are padding,
    so attention over them is the attention over the input cells alone.

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
        out_mask.append(has if active is None else has & active[:, None])
    return torch.cat(out_features, 1), torch.cat(out_boxes, 1), torch.cat(out_mask, 1)
