import numpy as np
import pytest

from edgecap.workshop.data.datasets import ImageRecord
from edgecap.workshop.data.region_features import RegionFeatureError, RegionFeatureStore, image_sizes

C = 16  # feature channels (2048 in real bottom-up features; small to keep fixtures tiny)


def _regions(seed: int, n: int = 5, width: float = 640.0, height: float = 480.0):
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((n, C)).astype(np.float32)
    x1 = rng.uniform(0, width * 0.6, n)
    y1 = rng.uniform(0, height * 0.6, n)
    boxes = np.stack([x1, y1, x1 + rng.uniform(1, width * 0.5, n), y1 + rng.uniform(1, height * 0.5, n)], axis=1)
    boxes[0] = [-3.0, -2.0, width + 10.0, height + 5.0]  # detectors overshoot the border: must be clipped
    return feats, boxes.astype(np.float32)


@pytest.fixture()
def per_image_dir(tmp_path):
    root = tmp_path / "bu_npz"
    root.mkdir()
    feats, boxes = _regions(0)
    np.savez(root / "391895.npz", x=feats, bbox=boxes, image_w=640, image_h=480, num_bbox=5)
    feats, boxes = _regions(1, n=3, width=500, height=375)
    np.savez_compressed(root / "522418.npz", feat=feats.astype(np.float16), boxes=boxes, w=500, h=375)
    return root


@pytest.fixture()
def cocobu_dir(tmp_path):
    root = tmp_path / "data"
    (root / "cocobu_att").mkdir(parents=True)
    (root / "cocobu_box").mkdir()
    (root / "cocobu_fc").mkdir()  # present in real downloads; ignored
    for seed, image_id in enumerate(("391895", "522418")):
        feats, boxes = _regions(seed, n=4 + seed)
        np.savez_compressed(root / "cocobu_att" / f"{image_id}.npz", feat=feats)
        np.save(root / "cocobu_box" / f"{image_id}.npy", boxes)
    feats, _ = _regions(9)
    np.save(root / "cocobu_att" / "77.npy", feats)  # features without boxes: not a complete entry
    return root


def _expected_boxes(boxes, width, height):
    return np.clip(boxes / np.array([width, height, width, height], dtype=np.float32), 0.0, 1.0)


def test_per_image_layout(per_image_dir):
    store = RegionFeatureStore(per_image_dir)
    assert store.layout == "per_image" and store.feature_dim == C
    assert store.ids() == ["391895", "522418"] and len(store) == 2
    assert "391895" in store and "1" not in store and 391895 not in store and "../x" not in store
    feats, boxes = store.get("391895")
    ref_feats, ref_boxes = _regions(0)
    assert feats.dtype == np.float32 and boxes.dtype == np.float32
    assert feats.shape == (5, C) and boxes.shape == (5, 4)
    np.testing.assert_array_equal(feats, ref_feats)
    np.testing.assert_allclose(boxes, _expected_boxes(ref_boxes, 640, 480), rtol=1e-6)
    np.testing.assert_array_equal(boxes[0], [0.0, 0.0, 1.0, 1.0])
    assert boxes.min() >= 0.0 and boxes.max() <= 1.0
    feats, boxes = store.get("522418")  # float16 storage, alternative key names, w/h
    assert feats.dtype == np.float32 and feats.shape == (3, C)
    np.testing.assert_allclose(boxes, _expected_boxes(_regions(1, n=3, width=500, height=375)[1], 500, 375), 1e-6)


def test_self_critical_layout(cocobu_dir):
    sizes = {"391895": (640, 480), "522418": (640, 480)}
    for root in (cocobu_dir, cocobu_dir / "cocobu_att"):
        store = RegionFeatureStore(root, image_sizes=sizes)
        assert store.layout == "att_box" and store.feature_dim == C
        assert store.ids() == ["391895", "522418"] and "77" not in store
        feats, boxes = store.get("522418")
        ref_feats, ref_boxes = _regions(1, n=5)
        np.testing.assert_array_equal(feats, ref_feats)
        np.testing.assert_allclose(boxes, _expected_boxes(ref_boxes, 640, 480), rtol=1e-6)
    with pytest.raises(FileNotFoundError, match="cocobu_box/77.npy"):
        store.get("77")


def test_self_critical_needs_image_sizes(cocobu_dir):
    store = RegionFeatureStore(cocobu_dir)
    with pytest.raises(RegionFeatureError, match=r"cocobu_box/391895\.npy.*image size.*unknown"):
        store.get("391895")
    store = RegionFeatureStore(cocobu_dir, image_sizes={"391895": (0, 480)})
    with pytest.raises(RegionFeatureError, match="must be positive"):
        store.get("391895")
    normalised = RegionFeatureStore(cocobu_dir, normalized_boxes=True)
    _, boxes = normalised.get("391895")
    assert boxes.max() == 1.0  # already-relative boxes are only clipped


def test_image_sizes_from_records():
    records = [ImageRecord("1", None, "val", (), 640, 480), ImageRecord("2", None, "val", ())]
    assert image_sizes(records) == {"1": (640, 480)}


def test_layout_selection_errors(tmp_path, cocobu_dir):
    with pytest.raises(FileNotFoundError, match="not found"):
        RegionFeatureStore(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RegionFeatureError, match="no region features"):
        RegionFeatureStore(empty)
    (cocobu_dir / "cocotest_att").mkdir()
    (cocobu_dir / "cocotest_box").mkdir()
    with pytest.raises(RegionFeatureError, match="several feature sets"):
        RegionFeatureStore(cocobu_dir)
    assert RegionFeatureStore(cocobu_dir, name="cocobu").ids() == ["391895", "522418"]
    with pytest.raises(RegionFeatureError, match="nope_att"):
        RegionFeatureStore(cocobu_dir, name="nope")
    lonely = tmp_path / "lonely"
    (lonely / "x_att").mkdir(parents=True)
    with pytest.raises(RegionFeatureError, match="x_box"):
        RegionFeatureStore(lonely)


def test_missing_image(per_image_dir):
    store = RegionFeatureStore(per_image_dir)
    with pytest.raises(FileNotFoundError, match="123.npz"):
        store.get("123")
    with pytest.raises(RegionFeatureError, match="plain file-name"):
        store.get("../391895")


def _bad(root, name, **arrays):
    defaults = {"feat": np.ones((3, C), np.float32), "bbox": np.tile([[1.0, 2.0, 30.0, 40.0]], (3, 1))}
    defaults.update({"image_w": 100, "image_h": 50})
    defaults.update(arrays)
    np.savez(root / f"{name}.npz", **{k: v for k, v in defaults.items() if v is not None})


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        ({"feat": np.ones((3, C, 1), np.float32)}, r"shape \(N, C\)"),
        ({"feat": np.ones((0, C), np.float32), "bbox": np.ones((0, 4))}, r"shape \(N, C\)"),
        ({"bbox": np.ones((3, 5))}, r"shape \(N, 4\)"),
        ({"bbox": np.tile([[1.0, 2.0, 30.0, 40.0]], (2, 1))}, "2 boxes for 3 feature rows"),
        ({"feat": np.full((3, C), np.nan, np.float32)}, "features contain NaN"),
        ({"bbox": np.array([[1.0, 2.0, np.inf, 4.0]] * 3)}, "boxes contain NaN or infinite"),
        ({"bbox": np.array([[10.0, 2.0, 5.0, 4.0]] * 3)}, "x2 < x1"),
        ({"feat": None}, "no features array"),
        ({"bbox": None}, "no boxes array"),
        ({"image_w": np.array([1, 2])}, "single number"),
        # Found by tests/fuzz: a complex size passed the np.number check and float() raised TypeError.
        ({"image_w": np.array(64 + 0j, np.complex64)}, "single number"),
        ({"image_w": -5}, "must be positive"),
        ({"feat": np.ones((3, C), np.complex64)}, "real numbers"),
        ({"feat": np.ones((3, C + 1), np.float32)}, f"{C + 1}-d features, but this store has {C}-d"),
    ],
)
def test_bad_files_are_reported_with_their_name(tmp_path, arrays, match):
    _bad(tmp_path, "0")
    _bad(tmp_path, "1", **arrays)
    store = RegionFeatureStore(tmp_path)
    store.get("0")  # fixes feature_dim from the good file
    with pytest.raises(RegionFeatureError, match=match) as info:
        store.get("1")
    assert "1.npz" in str(info.value)


def test_unreadable_file(tmp_path):
    (tmp_path / "5.npz").write_bytes(b"definitely not a zip archive")
    with pytest.raises(RegionFeatureError, match=r"5\.npz: cannot read"):
        RegionFeatureStore(tmp_path).get("5")
    np.savez(tmp_path / "6.npz", feat=np.array([object()] * 3, dtype=object), bbox=np.ones((3, 4)))
    with pytest.raises(RegionFeatureError, match=r"6\.npz: cannot read"):
        RegionFeatureStore(tmp_path).get("6")


def test_per_image_size_falls_back_to_mapping(tmp_path):
    _bad(tmp_path, "9", image_w=None, image_h=None)
    with pytest.raises(RegionFeatureError, match="image_sizes"):
        RegionFeatureStore(tmp_path).get("9")
    _, boxes = RegionFeatureStore(tmp_path, image_sizes={"9": (100, 50)}).get("9")
    np.testing.assert_allclose(boxes[0], [0.01, 0.04, 0.3, 0.8], rtol=1e-6)


@pytest.mark.parametrize(
    ("offset", "value", "what"),
    [(10, 99, "unsupported compression method (NotImplementedError)"), (8, 1, "encrypted entry (RuntimeError)")],
)
def test_corrupt_zip_directory_is_region_feature_error(tmp_path, offset, value, what):
    """Found by tests/fuzz: a .npz whose zip directory claims an unknown compression method or encryption made
    np.load raise NotImplementedError / RuntimeError, which escaped as themselves."""
    np.savez(tmp_path / "1.npz", feat=np.ones((2, 3), np.float32), bbox=np.ones((2, 4), np.float32))
    data = bytearray((tmp_path / "1.npz").read_bytes())
    entry = data.index(b"PK\x01\x02")  # the first central-directory entry; zipfile trusts its fields
    data[entry + offset : entry + offset + 2] = value.to_bytes(2, "little")
    (tmp_path / "1.npz").write_bytes(bytes(data))
    with pytest.raises(RegionFeatureError, match=r"1\.npz: cannot read region features"):
        RegionFeatureStore(tmp_path, normalized_boxes=True).get("1")
