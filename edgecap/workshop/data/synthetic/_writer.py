"""Write a synthetic scene-captioning dataset to disk: PNG/JPEG images plus a Karpathy-format ``dataset.json``.

The output is a pure function of the arguments: every image draws from its own generator seeded with
``(seed, 1, index)``, the split assignment and held-out pairs from ``(seed, 0)``, so re-running gives byte-identical
JSON and pixel-identical images, and the result does not depend on iteration order. The dataset directory is built
beside the target and moved into place only when complete (:func:`edgecap.runtime._io.atomic_directory`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.runtime._io import atomic_directory, atomic_write_text
from edgecap.workshop._progress import track
from edgecap.workshop.data.synthetic._attributes import COLOURS, SHAPES
from edgecap.workshop.data.synthetic._grammar import describe_scene
from edgecap.workshop.data.synthetic._render import render_scene
from edgecap.workshop.data.synthetic._scene import Pair, sample_scene

__all__ = ["GENERATOR_VERSION", "SynthError", "generate_dataset", "split_counts"]

# Bumped whenever the same arguments would produce different data (grammar, renderer or sampler changes).
GENERATOR_VERSION = 1
SPLIT_NAMES = ("train", "val", "test")
IMAGE_FORMATS = {"png": "PNG", "jpg": "JPEG"}
_IMAGE_DIR = "images"
_JPEG_QUALITY = 95
_PNG_COMPRESS_LEVEL = 3  # noisy images: level 3 is as small as level 6 and 2.5x faster to encode


class SynthError(ValueError):
    """Invalid arguments for the synthetic dataset generator."""


def split_counts(num_images: int, fractions: Sequence[float]) -> tuple[int, int, int]:
    """Images per train/val/test split: largest-remainder rounding of ``num_images * fractions``.

    Raises:
        SynthError: not three non-negative fractions summing to 1.
    """
    if len(fractions) != 3 or any(not np.isfinite(f) or f < 0 for f in fractions):
        raise SynthError(f"splits must be three non-negative fractions (train, val, test), got {tuple(fractions)}")
    if abs(sum(fractions) - 1.0) > 1e-6:
        raise SynthError(f"split fractions must sum to 1, got {tuple(fractions)} (sum {sum(fractions):.6g})")
    exact = [num_images * f for f in fractions]
    counts = [int(np.floor(e)) for e in exact]
    by_remainder = sorted(range(3), key=lambda k: (-(exact[k] - counts[k]), k))
    for k in by_remainder[: num_images - sum(counts)]:
        counts[k] += 1
    return counts[0], counts[1], counts[2]


def _heldout_pairs(rng: np.random.Generator, count: int) -> list[Pair]:
    """``count`` colour/shape pairs using each colour and each shape at most once, so every colour and every
    shape is still seen in training with other partners."""
    colours = [list(COLOURS)[k] for k in rng.permutation(len(COLOURS))]
    shapes = [list(SHAPES)[k] for k in rng.permutation(len(SHAPES))]
    return sorted(zip(colours[:count], shapes[:count], strict=True))


def _check_target(out_dir: Path, overwrite: bool) -> None:
    """Refuse to clobber a non-empty directory, and refuse ``overwrite`` on anything but a synthetic dataset."""
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a directory")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if not overwrite:
        raise FileExistsError(f"{out_dir} is not empty; pass overwrite=True (CLI: --overwrite) to replace it")
    try:
        marker = json.loads((out_dir / "dataset.json").read_text(encoding="utf-8")).get("dataset")
    except (OSError, ValueError, AttributeError):
        marker = None
    if marker != "synthetic":
        raise FileExistsError(
            f"refusing to overwrite {out_dir}: it is not empty and holds no synthetic dataset.json "
            "(only a directory written by this generator, or an empty one, is replaced)"
        )


def generate_dataset(
    out_dir: str | Path,
    num_images: int,
    seed: int = 0,
    image_size: int = 256,
    splits: Sequence[float] = (0.8, 0.1, 0.1),
    compositional: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    *,
    captions_per_image: int = 5,
    image_format: str = "png",
    num_heldout_pairs: int = 4,
) -> Path:
    """Generate the synthetic captioning dataset.

    Args:
        out_dir: directory to create; it receives ``images/NNNNNN.png`` and ``dataset.json``.
        num_images: images to draw (>= 1).
        seed: non-negative integer; the whole output is a deterministic function of the arguments.
        image_size: square image side in pixels (>= 224; 256 matches the backbone's resize-256 / crop-224).
        splits: train/val/test fractions (assigned by a seeded permutation, largest-remainder rounding).
        compositional: hold out ``num_heldout_pairs`` colour/shape pairs: no training image contains them, every
            val/test image contains at least one. The pairs are listed in ``dataset.json["heldout_pairs"]``.
        overwrite: replace ``out_dir`` if it is a non-empty synthetic dataset directory.
        progress: show a progress bar.
        captions_per_image: reference captions per image (1..20).
        image_format: ``"png"`` (lossless, ~80 KB per 256 px image) or ``"jpg"`` (quality 95, ~26 KB).
        num_heldout_pairs: pairs held out in compositional mode (1..8).

    Returns:
        The path of ``dataset.json``.

    Raises:
        SynthError: invalid arguments.
        FileExistsError: ``out_dir`` is not empty and ``overwrite`` is false, or is not a synthetic dataset.
    """
    out_dir = Path(out_dir)
    if isinstance(num_images, bool) or not isinstance(num_images, int) or num_images < 1:
        raise SynthError(f"num_images must be a positive integer, got {num_images!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SynthError(f"seed must be a non-negative integer, got {seed!r}")
    if not isinstance(image_size, int) or image_size < 224:
        raise SynthError(f"image_size must be an integer >= 224, got {image_size!r}")
    if image_format not in IMAGE_FORMATS:
        raise SynthError(f"image_format must be one of {sorted(IMAGE_FORMATS)}, got {image_format!r}")
    if not 1 <= num_heldout_pairs <= min(len(COLOURS), len(SHAPES)):
        raise SynthError(f"num_heldout_pairs must be in 1..{min(len(COLOURS), len(SHAPES))}, got {num_heldout_pairs}")
    if not 1 <= captions_per_image <= 20:
        raise SynthError(f"captions_per_image must be in 1..20, got {captions_per_image}")
    counts = split_counts(num_images, tuple(float(f) for f in splits))
    _check_target(out_dir, overwrite)

    plan_rng = np.random.default_rng([seed, 0])
    labels = np.repeat(np.arange(3), counts)[plan_rng.permutation(num_images)]
    heldout = _heldout_pairs(plan_rng, num_heldout_pairs) if compositional else []

    entries: list[dict[str, Any]] = []
    sentid = 0
    with atomic_directory(out_dir, overwrite=True) as tmp:
        (tmp / _IMAGE_DIR).mkdir()
        for index in track(range(num_images), "synthesising", enabled=progress):
            split = SPLIT_NAMES[int(labels[index])]
            rng = np.random.default_rng([seed, 1, index])
            scene = sample_scene(
                rng,
                image_size,
                exclude_pairs=heldout if split == "train" else (),
                require_pairs=heldout if split != "train" else (),
            )
            image = render_scene(scene, image_size, rng)
            captions = describe_scene(scene, rng, captions_per_image)
            filename = f"{index:06d}.{image_format}"
            if image_format == "png":
                image.save(tmp / _IMAGE_DIR / filename, "PNG", compress_level=_PNG_COMPRESS_LEVEL)
            else:
                image.save(tmp / _IMAGE_DIR / filename, "JPEG", quality=_JPEG_QUALITY, subsampling=0)
            sentences = []
            for tokens in captions:
                sentences.append({"tokens": tokens, "raw": " ".join(tokens), "imgid": index, "sentid": sentid})
                sentid += 1
            entries.append(
                {
                    "filepath": _IMAGE_DIR,
                    "filename": filename,
                    "imgid": index,
                    "cocoid": index,
                    "split": split,
                    "sentences": sentences,
                    "sentids": [s["sentid"] for s in sentences],
                    "width": image_size,
                    "height": image_size,
                    "scene": scene.to_dict(),
                }
            )
        document = {
            "dataset": "synthetic",
            "generator": {
                "version": GENERATOR_VERSION,
                "seed": seed,
                "num_images": num_images,
                "image_size": image_size,
                "splits": [float(f) for f in splits],
                "captions_per_image": captions_per_image,
                "image_format": image_format,
                "compositional": compositional,
            },
            "heldout_pairs": [list(p) for p in heldout],
            "images": entries,
        }
        atomic_write_text(tmp / "dataset.json", json.dumps(document) + "\n")
    return out_dir / "dataset.json"
