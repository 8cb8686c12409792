"""Fuzz the region-feature reader: any ``.npz`` / ``.npy`` content loads to finite, consistent arrays or raises
``RegionFeatureError`` (a missing file: ``FileNotFoundError``, documented)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edgecap.workshop.data.region_features import RegionFeatureError, RegionFeatureStore

from .strategies import byte_mutations

KEYS = ["feat", "features", "x", "bbox", "boxes", "image_w", "image_h", "w", "h", "other"]
DTYPES = st.sampled_from([np.float32, np.float64, np.float16, np.int64, np.uint8, np.bool_, np.complex64, "U3"])


def _good_npz() -> bytes:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    xy = rng.uniform(0, 100, size=(5, 2))
    np.savez(
        buf,
        feat=rng.normal(size=(5, 8)).astype(np.float32),
        bbox=np.concatenate([xy, xy + 10], axis=1).astype(np.float32),
        image_w=128,
        image_h=96,
    )
    return buf.getvalue()


GOOD = _good_npz()

arrays = DTYPES.flatmap(
    lambda dtype: hnp.arrays(
        dtype,
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6),
        elements=None if dtype in ("U3",) else hnp.from_dtype(np.dtype(dtype), allow_subnormal=True),
    )
)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-regions")


def _check(store_root: Path, **kwargs: object) -> None:
    try:
        store = RegionFeatureStore(store_root, **kwargs)
        feats, boxes = store.get("1")
    except RegionFeatureError:
        return
    assert feats.dtype == np.float32 and feats.ndim == 2 and feats.shape[0] >= 1
    assert boxes.shape == (feats.shape[0], 4) and np.isfinite(boxes).all()
    assert (boxes >= 0).all() and (boxes <= 1).all() and np.isfinite(feats).all()


def _fresh(root: Path, name: str) -> Path:
    folder = root / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    return folder


def test_seed_loads(root: Path) -> None:
    folder = _fresh(root, "seed")
    (folder / "1.npz").write_bytes(GOOD)
    feats, boxes = RegionFeatureStore(folder).get("1")
    assert feats.shape == (5, 8) and boxes.shape == (5, 4)


@given(contents=st.dictionaries(st.sampled_from(KEYS), arrays, min_size=1, max_size=5))
def test_per_image_npz_arrays(root: Path, contents: dict[str, np.ndarray]) -> None:
    """Per-image layout: any keys, dtypes and shapes (empty, scalar, 3-d, NaN/inf, strings, bools, complex)."""
    folder = _fresh(root, "npz")
    np.savez(folder / "1.npz", **contents)
    _check(folder)


@given(feat=arrays, box=arrays, normalized=st.booleans())
def test_self_critical_npy_arrays(root: Path, feat: np.ndarray, box: np.ndarray, normalized: bool) -> None:
    """self-critical layout: ``cocobu_att/1.npy`` + ``cocobu_box/1.npy`` of any dtype and shape."""
    folder = _fresh(root, "sc")
    (folder / "cocobu_att").mkdir()
    (folder / "cocobu_box").mkdir()
    np.save(folder / "cocobu_att" / "1.npy", feat)
    np.save(folder / "cocobu_box" / "1.npy", box)
    _check(folder, normalized_boxes=normalized, image_sizes={"1": (64, 48)})


@given(data=byte_mutations(GOOD) | st.binary(max_size=256))
def test_mutated_npz_bytes(root: Path, data: bytes) -> None:
    folder = _fresh(root, "bytes")
    (folder / "1.npz").write_bytes(data)
    _check(folder)
