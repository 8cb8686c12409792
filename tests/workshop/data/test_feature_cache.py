"""Feature cache: correct features, resumable after a crash, never silently reused with other settings."""

from __future__ import annotations

import fcntl
import io
import json
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from edgecap.runtime.images.load import ImageError, ImageNotFoundError
from edgecap.workshop.data.datasets import load_dataset
from edgecap.workshop.data.feature_cache import (
    CacheBusyError,
    CacheIncompleteError,
    CacheMismatchError,
    FeatureCache,
    FeatureCacheError,
    extract_features,
)
from edgecap.workshop.models.backbone import Backbone, create_backbone, grid_boxes

SIZE = 64  # test_efficientnet at 64 px: a 2x2 grid of 256-d features


pytestmark = pytest.mark.usefixtures("flush_denormals")


def _tiny(seed: int = 0, image_size: int = SIZE) -> Backbone:
    torch.manual_seed(seed)
    return create_backbone("test_efficientnet", pretrained=False, image_size=image_size)


def _make_dataset(root: Path, count: int = 7) -> Path:
    (root / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    entries = []
    for i in range(count):
        pixels = rng.integers(0, 256, (40 + 3 * i, 56, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "images" / f"img{i}.png")
        entries.append(
            {"filepath": "images", "filename": f"img{i}.png", "imgid": i, "split": "train",
             "sentences": [{"tokens": ["a", "thing"]}]}
        )  # fmt: skip
    (root / "dataset.json").write_text(json.dumps({"dataset": "toy", "images": entries}))
    return root


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return _make_dataset(tmp_path / "data")


def _count_calls(backbone: Backbone, fail_after: int | None = None) -> list[int]:
    """Count forward calls on this instance; raise after ``fail_after`` of them (a simulated crash)."""
    calls: list[int] = []
    forward: Callable = backbone.forward

    def counted(pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if fail_after is not None and len(calls) >= fail_after:
            raise KeyboardInterrupt("simulated interruption")
        calls.append(pixels.shape[0])
        return forward(pixels)

    backbone.forward = counted  # type: ignore[method-assign]
    return calls


def _extract(dataset: Path, cache_dir: Path, backbone: Backbone, **kwargs: object) -> FeatureCache:
    options = {"batch_size": 2, "shard_size": 4, "progress": False, "num_workers": 0}
    options.update(kwargs)
    return extract_features(dataset, cache_dir, backbone=backbone, **options)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------- contents


def test_extract_and_read(dataset: Path, tmp_path: Path) -> None:
    backbone = _tiny()
    cache = _extract(dataset, tmp_path / "cache", backbone)
    assert len(cache) == 7 and cache.ids() == [str(i) for i in range(7)]
    assert cache.feature_dim == 256 and cache.num_cells == 4 and cache.dtype == "float16"
    assert cache.spec == json.loads(json.dumps(backbone.spec))
    assert "3" in cache and "99" not in cache and 3 not in cache

    feats, boxes = cache.get("3")
    assert feats.shape == (4, 256) and feats.dtype == np.float32
    assert boxes.shape == (4, 4) and boxes.dtype == np.float32
    np.testing.assert_array_equal(boxes, grid_boxes(2, 2).numpy())
    with torch.no_grad():
        direct = backbone(backbone.preprocess(dataset / "images" / "img3.png"))[0][0].numpy()
    np.testing.assert_allclose(feats, direct, rtol=2e-3, atol=2e-4)  # float16 storage

    batch, batch_boxes = cache.get_batch(["6", "0", "3", "5"])
    assert batch.shape == (4, 4, 256) and batch_boxes.shape == (4, 4, 4)
    for row, image_id in enumerate(["6", "0", "3", "5"]):
        np.testing.assert_array_equal(batch[row], cache.get(image_id)[0])
    with pytest.raises(KeyError, match="'99' is not in feature cache"):
        cache.get("99")


def test_files_on_disk(dataset: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    cache = _extract(dataset, tmp_path / "cache", _tiny())
    names = sorted(p.name for p in cache.dir.iterdir())
    assert names == [
        ".lock", "boxes.safetensors", "index.json", "meta.json", "shard_00000.safetensors", "shard_00001.safetensors"
    ]  # fmt: skip
    meta = json.loads((cache.dir / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["num_images"] == 7 and meta["shard_size"] == 4
    assert meta["dataset"]["num_images"] == 7 and len(meta["dataset"]["fingerprint"]) == 64
    assert meta["extraction"]["images_extracted"] == 7 and meta["extraction"]["torch_threads"] >= 1
    assert json.loads((cache.dir / "index.json").read_text())["5"] == [1, 1]
    shard = load_file(str(cache.dir / "shard_00001.safetensors"))["features"]  # plain safetensors, any reader
    assert shard.shape == (3, 4, 256) and shard.dtype == np.float16
    np.testing.assert_array_equal(shard[1].astype(np.float32), cache.get("5")[0])
    assert cache.nbytes > 7 * 4 * 256 * 2


def test_float32_storage_is_exact(dataset: Path, tmp_path: Path) -> None:
    backbone = _tiny()
    cache = _extract(dataset, tmp_path / "cache", backbone, dtype="float32", batch_size=1)
    with torch.no_grad():
        direct = backbone(backbone.preprocess(dataset / "images" / "img2.png"))[0][0].numpy()
    np.testing.assert_array_equal(cache.get("2")[0], direct)


def test_decode_threads_do_not_change_results(dataset: Path, tmp_path: Path) -> None:
    serial = _extract(dataset, tmp_path / "serial", _tiny(), num_workers=0)
    threaded = _extract(dataset, tmp_path / "threaded", _tiny(), num_workers=3)
    np.testing.assert_array_equal(serial.get_batch(serial.ids())[0], threaded.get_batch(threaded.ids())[0])


def test_dataset_object_input(dataset: Path, tmp_path: Path) -> None:
    subset = load_dataset(dataset).subset(["4", "1"])
    cache = extract_features(subset, tmp_path / "cache", backbone=_tiny(), progress=False)
    assert cache.ids() == ["4", "1"]


def test_records_without_paths_rejected(dataset: Path, tmp_path: Path) -> None:
    from edgecap.workshop.data.datasets import load_karpathy

    no_paths = load_karpathy(dataset / "dataset.json", None)
    with pytest.raises(ValueError, match="no image file path"):
        extract_features(no_paths, tmp_path / "cache", backbone=_tiny(), progress=False)


# ----------------------------------------------------------------------------------------------- resume


def test_interrupted_run_resumes_to_the_same_result(dataset: Path, tmp_path: Path) -> None:
    reference = _extract(dataset, tmp_path / "reference", _tiny())

    crashing = _tiny()
    calls = _count_calls(crashing, fail_after=3)  # shard 0 = 2 batches, then a crash inside shard 1
    with pytest.raises(KeyboardInterrupt):
        _extract(dataset, tmp_path / "cache", crashing)
    assert calls == [2, 2, 2]
    assert (tmp_path / "cache" / "shard_00000.safetensors").is_file()
    assert not (tmp_path / "cache" / "shard_00001.safetensors").exists()
    assert not list((tmp_path / "cache").glob(".*.tmp"))
    with pytest.raises(CacheIncompleteError, match="re-run"):
        FeatureCache(tmp_path / "cache")

    resumed_backbone = _tiny()
    resumed_calls = _count_calls(resumed_backbone)
    resumed = _extract(dataset, tmp_path / "cache", resumed_backbone)
    assert resumed_calls == [2, 1]  # only shard 1 (3 images) is computed again
    assert resumed.ids() == reference.ids()
    np.testing.assert_array_equal(resumed.get_batch(resumed.ids())[0], reference.get_batch(reference.ids())[0])


def test_complete_cache_is_reused_without_computing(dataset: Path, tmp_path: Path) -> None:
    _extract(dataset, tmp_path / "cache", _tiny())
    again = _tiny()
    calls = _count_calls(again)
    cache = _extract(dataset, tmp_path / "cache", again)
    assert calls == [] and len(cache) == 7


def test_stale_temporary_files_are_removed(dataset: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    (cache_dir / ".shard_00000.safetensors.abc123.tmp").write_bytes(b"half a shard")
    _extract(dataset, cache_dir, _tiny())
    assert not list(cache_dir.glob(".*.tmp"))


def test_corrupt_shard_is_recomputed_on_resume(dataset: Path, tmp_path: Path) -> None:
    crashing = _tiny()
    _count_calls(crashing, fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        _extract(dataset, tmp_path / "cache", crashing)
    shard = tmp_path / "cache" / "shard_00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])  # e.g. a disk problem after the rename
    calls = _count_calls(backbone := _tiny())
    cache = _extract(dataset, tmp_path / "cache", backbone)
    assert calls == [2, 2, 2, 1] and len(cache) == 7


# ----------------------------------------------------------------------------------------------- mismatches


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"backbone": "size"}, "backbone.image_size"),
        ({"backbone": "seed"}, "backbone.weights.sha256"),
        ({"dtype": "float32"}, "dtype"),
        ({"shard_size": 3}, "shard_size"),
    ],
)
def test_other_settings_are_never_silently_reused(
    dataset: Path, tmp_path: Path, change: dict[str, object], field: str
) -> None:
    _extract(dataset, tmp_path / "cache", _tiny())
    backbone = _tiny()
    kwargs = dict(change)
    if kwargs.pop("backbone", None) == "size":
        backbone = _tiny(image_size=96)
    elif change.get("backbone") == "seed":
        backbone = _tiny(seed=1)
    with pytest.raises(CacheMismatchError, match=rf"(?s){field}: cache has .*--overwrite"):
        _extract(dataset, tmp_path / "cache", backbone, **kwargs)
    rebuilt = _extract(dataset, tmp_path / "cache", backbone, overwrite=True, **kwargs)
    assert len(rebuilt) == 7 and rebuilt.spec == json.loads(json.dumps(backbone.spec))


def test_changed_dataset_is_a_mismatch(dataset: Path, tmp_path: Path) -> None:
    _extract(dataset, tmp_path / "cache", _tiny())
    Image.new("RGB", (30, 30), (9, 9, 9)).save(dataset / "images" / "img2.png")  # regenerated image
    with pytest.raises(CacheMismatchError, match="dataset.fingerprint"):
        _extract(dataset, tmp_path / "cache", _tiny())


def test_partial_cache_with_other_settings_is_a_mismatch(dataset: Path, tmp_path: Path) -> None:
    crashing = _tiny()
    _count_calls(crashing, fail_after=1)
    with pytest.raises(KeyboardInterrupt):
        _extract(dataset, tmp_path / "cache", crashing)
    with pytest.raises(CacheMismatchError, match="backbone.image_size"):
        _extract(dataset, tmp_path / "cache", _tiny(image_size=96))


def test_foreign_directory_is_never_wiped(dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "important"
    out.mkdir()
    (out / "thesis.tex").write_text("do not delete")
    for overwrite in (False, True):
        with pytest.raises(FeatureCacheError, match="thesis.tex"):
            _extract(dataset, out, _tiny(), overwrite=overwrite)
    assert (out / "thesis.tex").read_text() == "do not delete"


def test_concurrent_extraction_refused(dataset: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    with open(cache_dir / ".lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(CacheBusyError, match="another process"):
            _extract(dataset, cache_dir, _tiny())


# ----------------------------------------------------------------------------------------------- bad images


def _truncate(path: Path) -> None:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buffer, "PNG")
    path.write_bytes(buffer.getvalue()[:300])


def test_bad_image_stops_with_its_name_and_keeps_finished_shards(dataset: Path, tmp_path: Path) -> None:
    _truncate(dataset / "images" / "img5.png")
    with pytest.raises(ImageError, match=r"(?s)img5\.png.*image id 5.*--skip-bad"):
        _extract(dataset, tmp_path / "cache", _tiny())
    assert (tmp_path / "cache" / "shard_00000.safetensors").is_file()


def test_missing_image_file(dataset: Path, tmp_path: Path) -> None:
    (dataset / "images" / "img1.png").unlink()
    with pytest.raises(ImageNotFoundError, match=r"img1\.png"):
        _extract(dataset, tmp_path / "cache", _tiny())


def test_skip_bad_records_and_continues(dataset: Path, tmp_path: Path) -> None:
    _truncate(dataset / "images" / "img5.png")
    (dataset / "images" / "img0.png").write_bytes(b"")
    cache = _extract(dataset, tmp_path / "cache", _tiny(), skip_bad=True)
    assert len(cache) == 5 and "5" not in cache and "0" not in cache
    assert set(cache.skipped) == {"0", "5"} and "img5.png" in cache.skipped["5"]
    with pytest.raises(KeyError, match="skipped during extraction"):
        cache.get("5")
    feats, _ = cache.get("6")  # rows after a skipped image still map to the right image
    backbone = _tiny()
    with torch.no_grad():
        direct = backbone(backbone.preprocess(dataset / "images" / "img6.png"))[0][0].numpy()
    np.testing.assert_allclose(feats, direct, rtol=2e-3, atol=2e-4)


def test_float16_overflow_is_refused(dataset: Path, tmp_path: Path) -> None:
    backbone = _tiny()
    forward = backbone.forward

    def huge(pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features, boxes = forward(pixels)
        return features + 1e6, boxes

    backbone.forward = huge  # type: ignore[method-assign]
    with pytest.raises(FeatureCacheError, match="float32"):
        _extract(dataset, tmp_path / "cache", backbone)


# ----------------------------------------------------------------------------------------------- reading


def test_reader_errors(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="edgecap features"):
        FeatureCache(tmp_path / "nothing")
    cache = _extract(dataset, tmp_path / "cache", _tiny())
    shard = cache.dir / "shard_00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-64])
    fresh = FeatureCache(cache.dir)
    fresh.get("0")
    with pytest.raises(FeatureCacheError, match=r"shard_00001.*truncated"):
        fresh.get("5")


def test_lru_and_pickling(dataset: Path, tmp_path: Path) -> None:
    _extract(dataset, tmp_path / "cache", _tiny())
    cache = FeatureCache(tmp_path / "cache", max_open_shards=1)
    expected = {i: cache.get(i)[0] for i in ("0", "6", "1")}
    assert len(cache._shards) == 1
    clone = pickle.loads(pickle.dumps(cache))
    assert len(clone._shards) == 0
    for image_id, feats in expected.items():
        np.testing.assert_array_equal(clone.get(image_id)[0], feats)


def test_opened_as_a_feature_source(dataset: Path, tmp_path: Path) -> None:
    from edgecap.workshop.data.sources import open_feature_source

    _extract(dataset, tmp_path / "cache", _tiny())
    source = open_feature_source(tmp_path / "cache")
    assert isinstance(source, FeatureCache) and source.feature_dim == 256
