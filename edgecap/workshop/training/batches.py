"""Turning dataset records + a feature source into padded training/evaluation batches.

Features are held in RAM (float16) when they fit under ``max_ram_bytes``, which makes CPU
training on the synthetic set fast; larger sources (COCO region features) are read per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from edgecap.runtime.vocab import Vocabulary


class FeatureSource(Protocol):
    feature_dim: int

    def get(self, image_id: str) -> tuple[np.ndarray, np.ndarray]: ...

    def __contains__(self, image_id: object) -> bool: ...


@dataclass
class VisualBatch:
    """Padded visual inputs: features (B, N, C) float32, boxes (B, N, 4), mask (B, N) bool (True = valid)."""

    features: torch.Tensor
    boxes: torch.Tensor
    mask: torch.Tensor

    def to(self, device: torch.device | str) -> VisualBatch:
        return VisualBatch(self.features.to(device), self.boxes.to(device), self.mask.to(device))

    def as_inputs(self) -> dict[str, torch.Tensor]:
        return {"features": self.features, "boxes": self.boxes, "feature_mask": self.mask}


def _pad_visual(items: Sequence[tuple[np.ndarray, np.ndarray]], dtype: torch.dtype) -> VisualBatch:
    n_max = max(f.shape[0] for f, _ in items)
    dim = items[0][0].shape[1]
    feats = torch.zeros(len(items), n_max, dim, dtype=dtype)
    boxes = torch.zeros(len(items), n_max, 4, dtype=torch.float32)
    mask = torch.zeros(len(items), n_max, dtype=torch.bool)
    for i, (f, b) in enumerate(items):
        n = f.shape[0]
        feats[i, :n] = torch.from_numpy(np.asarray(f, dtype=np.float32))
        boxes[i, :n] = torch.from_numpy(np.asarray(b, dtype=np.float32))
        mask[i, :n] = True
    return VisualBatch(feats, boxes, mask)


class FeatureBank:
    """Visual features for a fixed list of image ids, fetched as padded batches by row index."""

    def __init__(self, source: FeatureSource, image_ids: Sequence[str], max_ram_bytes: int = 6 << 30) -> None:
        missing = [i for i in image_ids if i not in source]
        if missing:
            shown = ", ".join(missing[:5])
            raise KeyError(
                f"{len(missing)} image(s) have no cached features (e.g. {shown}); "
                "run `edgecap features` for this dataset"
            )
        self.source = source
        self.image_ids = list(image_ids)
        self._preloaded: VisualBatch | None = None
        if image_ids:
            first, _ = source.get(self.image_ids[0])
            estimate = len(image_ids) * first.shape[0] * first.shape[1] * 2
            if estimate <= max_ram_bytes:
                items = [source.get(i) for i in self.image_ids]
                self._preloaded = _pad_visual(items, torch.float16)

    def __len__(self) -> int:
        return len(self.image_ids)

    def batch(self, rows: Sequence[int] | torch.Tensor) -> VisualBatch:
        rows_t = torch.as_tensor(rows, dtype=torch.long)
        if self._preloaded is not None:
            pre = self._preloaded
            mask = pre.mask[rows_t]
            n = int(mask.sum(1).max()) if len(rows_t) else 0
            return VisualBatch(pre.features[rows_t, :n].float(), pre.boxes[rows_t, :n], mask[:, :n])
        return _pad_visual([self.source.get(self.image_ids[int(r)]) for r in rows_t], torch.float32)


def encode_captions(vocab: Vocabulary, captions: Sequence[Sequence[str]], max_words: int) -> torch.Tensor:
    """Token matrix (B, T) with BOS ... EOS and right padding by the vocab's pad id."""
    seqs = [vocab.encode_caption(list(c), max_words=max_words) for c in captions]
    length = max(len(s) for s in seqs)
    out = torch.full((len(seqs), length), vocab.pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def pick_captions(
    captions: Sequence[Sequence[Sequence[str]]], per_image: int, generator: torch.Generator
) -> list[Sequence[str]]:
    """``per_image`` captions for each image: all of them in a shuffled order, cycling when an image has fewer."""
    picked: list[Sequence[str]] = []
    for caps in captions:
        if not caps:
            raise ValueError("an image in the training split has no captions")
        order = torch.randperm(len(caps), generator=generator).tolist()
        picked.extend(caps[order[k % len(caps)]] for k in range(per_image))
    return picked
