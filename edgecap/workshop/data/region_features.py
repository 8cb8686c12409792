"""Precomputed bottom-up (Faster R-CNN) region features, as a feature source.

ORT/ACORT, LaBERT and the Image Transformer were all trained on bottom-up-attention regions (10–100 boxes of 2048-d
features per image). People keep them on disk in one of two layouts, both read here:

* **one file per image**: ``DIR/<image_id>.npz`` with the features under ``feat`` (or ``x`` / ``features``), the
  boxes under ``bbox`` (or ``boxes``) in pixels, and the image size under ``image_w`` / ``image_h`` (or ``w`` /
  ``h``) — what the bottom-up TSV converters write;
* **self-critical.pytorch** (``cocobu``): ``DIR/<name>_att/<image_id>.npz`` (key ``feat``; ``.npy`` also accepted)
  and ``DIR/<name>_box/<image_id>.npy`` with pixel boxes. This layout stores no image size, so pass
  ``image_sizes`` (e.g. :func:`image_sizes` of a COCO-captions dataset, whose JSON lists widths and heights).

Boxes come out as ORT's relative coordinates: ``(x1/w, y1/h, x2/w, y2/h)`` clipped to ``[0, 1]``
(``object_relation_transformer: prepro_bbox_relative_coords.py``).
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.workshop.data.datasets import ImageRecord

__all__ = ["RegionFeatureError", "RegionFeatureStore", "image_sizes"]

_FEATURE_KEYS = ("feat", "features", "x")
_BOX_KEYS = ("bbox", "boxes")
_WIDTH_KEYS = ("image_w", "w")
_HEIGHT_KEYS = ("image_h", "h")


class RegionFeatureError(ValueError):
    """A region-feature file is unreadable or inconsistent, or the store cannot be set up."""


def image_sizes(records: Iterable[ImageRecord]) -> dict[str, tuple[int, int]]:
    """``{image_id: (width, height)}`` for the records that know their size (COCO caption files do)."""
    return {r.image_id: (r.width, r.height) for r in records if r.width is not None and r.height is not None}


class RegionFeatureStore:
    """Reads region features and pixel boxes for one image at a time; a feature source.

    Args:
        root: the feature directory: per-image ``.npz`` files, a folder holding ``<name>_att`` / ``<name>_box``,
            or the ``<name>_att`` folder itself.
        name: which ``<name>_att`` / ``<name>_box`` pair to use when ``root`` holds several (``cocobu``, ...).
        image_sizes: ``{image_id: (width, height)}`` in pixels, used when a file does not store the size.
        normalized_boxes: the stored boxes are already relative ``[0, 1]`` coordinates (no image size needed).

    Raises:
        FileNotFoundError: ``root`` does not exist.
        RegionFeatureError: ``root`` holds no recognisable layout, or the requested ``name`` is ambiguous/missing.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        name: str | None = None,
        image_sizes: Mapping[str, tuple[int, int]] | None = None,
        normalized_boxes: bool = False,
    ) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"region feature directory not found: {self.root}")
        self.image_sizes: Mapping[str, tuple[int, int]] = image_sizes or {}
        self.normalized_boxes = normalized_boxes
        self._att_dir, self._box_dir = self._find_layout(name)
        self.layout = "per_image" if self._box_dir is None else "att_box"
        self._feature_dim: int | None = None

    # ---- layout ---------------------------------------------------------------------------------------------------

    def _find_layout(self, name: str | None) -> tuple[Path, Path | None]:
        root = self.root
        if root.name.endswith("_att") and (name is None or root.name == f"{name}_att"):
            box_dir = root.with_name(root.name[: -len("_att")] + "_box")
            if not box_dir.is_dir():
                raise RegionFeatureError(f"{root} looks like a self-critical '_att' folder but {box_dir} is missing")
            return root, box_dir
        prefixes = sorted(p.name[: -len("_att")] for p in root.glob("*_att") if p.is_dir())
        if name is not None:
            att_dir, box_dir = root / f"{name}_att", root / f"{name}_box"
            for folder in (att_dir, box_dir):
                if not folder.is_dir():
                    raise RegionFeatureError(f"region feature folder {folder} not found (name={name!r})")
            return att_dir, box_dir
        if len(prefixes) > 1:
            raise RegionFeatureError(f"{root} holds several feature sets {prefixes}; pass name=... to pick one")
        if len(prefixes) == 1:
            att_dir, box_dir = root / f"{prefixes[0]}_att", root / f"{prefixes[0]}_box"
            if not box_dir.is_dir():
                raise RegionFeatureError(f"{att_dir} has no matching box folder {box_dir}")
            return att_dir, box_dir
        if next(root.glob("*.npz"), None) is None:
            raise RegionFeatureError(
                f"no region features in {root}: expected <image_id>.npz files or <name>_att/ + <name>_box/ folders"
            )
        return root, None

    @staticmethod
    def _safe_id(image_id: object) -> bool:
        return (
            isinstance(image_id, str)
            and bool(image_id)
            and image_id not in (".", "..")
            and "/" not in image_id
            and "\\" not in image_id
            and "\0" not in image_id
        )

    def _feature_file(self, image_id: str) -> Path | None:
        for suffix in (".npz", ".npy") if self._box_dir is not None else (".npz",):
            path = self._att_dir / f"{image_id}{suffix}"
            if path.is_file():
                return path
        return None

    def _box_file(self, image_id: str) -> Path:
        assert self._box_dir is not None
        return self._box_dir / f"{image_id}.npy"

    def __contains__(self, image_id: object) -> bool:
        if not self._safe_id(image_id):
            return False
        assert isinstance(image_id, str)
        if self._feature_file(image_id) is None:
            return False
        return self._box_dir is None or self._box_file(image_id).is_file()

    def ids(self) -> list[str]:
        """Every image id with complete features (and boxes), sorted; scans the directory."""
        if self._box_dir is None:
            return sorted(p.stem for p in self._att_dir.glob("*.npz") if self._safe_id(p.stem))
        feats = {p.stem for pattern in ("*.npz", "*.npy") for p in self._att_dir.glob(pattern)}
        boxes = {p.stem for p in self._box_dir.glob("*.npy")}
        return sorted(i for i in feats & boxes if self._safe_id(i))

    def _first_id(self) -> str | None:
        for pattern in ("*.npz", "*.npy") if self._box_dir is not None else ("*.npz",):
            for path in self._att_dir.glob(pattern):
                if path.stem in self:
                    return path.stem
        return None

    def __len__(self) -> int:
        return len(self.ids())

    def __repr__(self) -> str:
        return f"RegionFeatureStore(root={str(self.root)!r}, layout={self.layout!r})"

    @property
    def feature_dim(self) -> int:
        """Feature channels ``C``, read from the first file on first use."""
        if self._feature_dim is None:
            first = self._first_id()
            if first is None:
                raise RegionFeatureError(f"no complete region-feature entries in {self.root}")
            self._feature_dim = int(self._read(first)[0].shape[1])
        return self._feature_dim

    # ---- reading ----------------------------------------------------------------------------------------------------

    def get(self, image_id: str) -> tuple[np.ndarray, np.ndarray]:
        """Features ``(N, C)`` float32 and boxes ``(N, 4)`` float32, normalised ``(x1, y1, x2, y2)`` in ``[0, 1]``.

        Raises:
            FileNotFoundError: no features for ``image_id`` (names the expected file).
            RegionFeatureError: the file is unreadable, shapes disagree, values are not finite, a box has
                ``x2 < x1`` / ``y2 < y1``, the image size is missing or non-positive, or ``C`` differs from
                :attr:`feature_dim`.
        """
        feats, boxes = self._read(image_id)
        if self._feature_dim is None:
            self._feature_dim = int(feats.shape[1])
        elif feats.shape[1] != self._feature_dim:
            raise RegionFeatureError(
                f"{self._describe(image_id)}: {feats.shape[1]}-d features, but this store has {self._feature_dim}-d"
            )
        return feats, boxes

    def _describe(self, image_id: str) -> str:
        path = self._feature_file(image_id)
        return str(path) if path is not None else f"{self._att_dir}/{image_id}.npz"

    def _read(self, image_id: str) -> tuple[np.ndarray, np.ndarray]:
        if not self._safe_id(image_id):
            raise RegionFeatureError(f"image id must be a plain file-name string, got {image_id!r} ({self.root})")
        feat_path = self._feature_file(image_id)
        if feat_path is None:
            raise FileNotFoundError(f"no region features for image {image_id!r}: {self._att_dir}/{image_id}.npz")
        arrays = _load_arrays(feat_path)
        feats = _pick(arrays, _FEATURE_KEYS, feat_path, "features")
        size: tuple[float, float] | None = None
        if self._box_dir is None:
            boxes = _pick(arrays, _BOX_KEYS, feat_path, "boxes")
            box_path = feat_path
            width, height = _scalar(arrays, _WIDTH_KEYS, feat_path), _scalar(arrays, _HEIGHT_KEYS, feat_path)
            if width is not None and height is not None:
                size = (width, height)
        else:
            box_path = self._box_file(image_id)
            if not box_path.is_file():
                raise FileNotFoundError(f"no region boxes for image {image_id!r}: {box_path}")
            boxes = _pick(_load_arrays(box_path), _BOX_KEYS, box_path, "boxes")
        if size is None and not self.normalized_boxes:
            size = self._size_from_mapping(image_id, box_path)
        feats = _check_features(feats, feat_path)
        boxes = _check_boxes(boxes, feats.shape[0], box_path)
        if not self.normalized_boxes:
            assert size is not None
            width, height = size
            if not (np.isfinite(width) and np.isfinite(height) and width > 0 and height > 0):
                raise RegionFeatureError(f"{box_path}: image size must be positive, got {width} x {height}")
            boxes = boxes / np.array([width, height, width, height], dtype=np.float32)
        return feats, np.ascontiguousarray(np.clip(boxes, 0.0, 1.0), dtype=np.float32)

    def _size_from_mapping(self, image_id: str, box_path: Path) -> tuple[float, float]:
        size = self.image_sizes.get(image_id)
        if size is None:
            raise RegionFeatureError(
                f"{box_path}: boxes are in pixels but the image size of {image_id!r} is unknown; pass "
                "image_sizes={image_id: (width, height)} (e.g. region_features.image_sizes(coco_dataset)) "
                "or normalized_boxes=True"
            )
        if len(size) != 2:
            raise RegionFeatureError(f"image_sizes[{image_id!r}] must be (width, height), got {size!r}")
        return float(size[0]), float(size[1])


# --------------------------------------------------------------------------------------------------------------------
# File helpers


def _load_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (by key) or ``.npy`` (under ``"feat"`` and ``"boxes"``), loaded eagerly."""
    try:
        loaded: Any = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            return {"feat": loaded, "boxes": loaded}
        with loaded as npz:
            return {key: npz[key] for key in npz.files}
    except MemoryError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise RegionFeatureError(f"{path}: cannot read region features ({err})") from None
    except Exception as err:  # a corrupt zip also raises NotImplementedError, RuntimeError (encrypted), zlib.error
        raise RegionFeatureError(f"{path}: cannot read region features ({type(err).__name__}: {err})") from None


def _pick(arrays: Mapping[str, np.ndarray], keys: tuple[str, ...], path: Path, what: str) -> np.ndarray:
    for key in keys:
        if key in arrays:
            return arrays[key]
    raise RegionFeatureError(f"{path}: no {what} array; expected one of {list(keys)}, found {sorted(arrays)}")


def _scalar(arrays: Mapping[str, np.ndarray], keys: tuple[str, ...], path: Path) -> float | None:
    for key in keys:
        if key in arrays:
            value = np.asarray(arrays[key])
            # np.number includes complex, which float() rejects with TypeError: only real numbers are sizes.
            real = np.issubdtype(value.dtype, np.integer) or np.issubdtype(value.dtype, np.floating)
            if value.size != 1 or not real:
                raise RegionFeatureError(
                    f"{path}: {key!r} must be a single number (integer or float), "
                    f"got shape {value.shape} dtype {value.dtype}"
                )
            return float(value.reshape(()))
    return None


def _check_features(feats: np.ndarray, path: Path) -> np.ndarray:
    if feats.ndim != 2 or feats.shape[0] == 0 or feats.shape[1] == 0:
        raise RegionFeatureError(f"{path}: features must have shape (N, C) with N, C >= 1, got {feats.shape}")
    if not np.issubdtype(feats.dtype, np.number) or np.issubdtype(feats.dtype, np.complexfloating):
        raise RegionFeatureError(f"{path}: features must be real numbers, got dtype {feats.dtype}")
    feats = np.ascontiguousarray(feats, dtype=np.float32)
    if not np.isfinite(feats).all():
        raise RegionFeatureError(f"{path}: features contain NaN or infinite values")
    return feats


def _check_boxes(boxes: np.ndarray, num_regions: int, path: Path) -> np.ndarray:
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise RegionFeatureError(f"{path}: boxes must have shape (N, 4) as (x1, y1, x2, y2), got {boxes.shape}")
    if boxes.shape[0] != num_regions:
        raise RegionFeatureError(f"{path}: {boxes.shape[0]} boxes for {num_regions} feature rows")
    if not np.issubdtype(boxes.dtype, np.number) or np.issubdtype(boxes.dtype, np.complexfloating):
        raise RegionFeatureError(f"{path}: boxes must be real numbers, got dtype {boxes.dtype}")
    boxes = np.asarray(boxes, dtype=np.float32)
    if not np.isfinite(boxes).all():
        raise RegionFeatureError(f"{path}: boxes contain NaN or infinite values")
    bad = np.flatnonzero((boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1]))
    if bad.size:
        raise RegionFeatureError(
            f"{path}: box {int(bad[0])} = {boxes[bad[0]].tolist()} has x2 < x1 or y2 < y1 (expected x1, y1, x2, y2)"
        )
    return boxes
