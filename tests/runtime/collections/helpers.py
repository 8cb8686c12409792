"""Tiny synthetic collections for the collection tests: a few folders of small PNGs, plus files that are not images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def make_collection(root: Path, images: int, folders: int = 4, bad: int = 0, seed: int = 0) -> list[Path]:
    """``images`` 24 x 24 PNGs spread over ``folders`` sub-folders of ``root`` (and ``bad`` truncated ``.jpg`` files
    among them); returns every image path in listing order (sorted by path parts)."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(images):
        folder = root / f"f{i % folders:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"img{i:05d}.png"
        Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    for i in range(bad):
        path = root / f"f{i % folders:02d}" / f"bad{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\xff\xd8\xff\xe0 truncated")
        paths.append(path)
    return sorted(paths, key=lambda p: p.relative_to(root).parts)
