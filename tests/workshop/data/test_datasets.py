import dataclasses
import json
from pathlib import Path

import pytest

from edgecap.runtime.vocab import build_vocab
from edgecap.workshop.data.datasets import (
    CaptionDataset,
    DatasetError,
    ImageRecord,
    load_coco_captions,
    load_dataset,
    load_karpathy,
)


def _karpathy_image(imgid, split, cocoid=None, filepath="val2014", n_sent=2, **extra):
    entry = {
        "filename": f"COCO_{filepath}_{imgid:012d}.jpg",
        "imgid": imgid,
        "split": split,
        "sentences": [
            {"tokens": ["a", "dog", str(imgid), str(k)], "raw": f"A dog {imgid} {k}.", "imgid": imgid, "sentid": k}
            for k in range(n_sent)
        ],
        "sentids": list(range(n_sent)),
        **extra,
    }
    if filepath is not None:
        entry["filepath"] = filepath
    if cocoid is not None:
        entry["cocoid"] = cocoid
    return entry


def _write(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


@pytest.fixture()
def karpathy_json(tmp_path):
    images = [
        _karpathy_image(0, "train", cocoid=391895, filepath="train2014"),
        _karpathy_image(1, "restval", cocoid=522418),
        _karpathy_image(2, "val", cocoid=184613),
        _karpathy_image(3, "test", cocoid=318219, n_sent=0),
    ]
    # A sentence with raw text only, and one that cleans to nothing (dropped).
    images[2]["sentences"].append({"raw": "A Man's T-shirt, red!", "imgid": 2, "sentid": 9})
    images[2]["sentences"].append({"raw": "...", "imgid": 2, "sentid": 10})
    return _write(tmp_path / "dataset_coco.json", {"dataset": "coco", "images": images})


@pytest.fixture()
def coco_json(tmp_path):
    data = {
        "info": {"description": "tiny"},
        "images": [
            {"id": 391895, "file_name": "COCO_val2014_000000391895.jpg", "width": 640, "height": 360},
            {"id": 522418, "file_name": "COCO_val2014_000000522418.jpg", "width": 640, "height": 480},
            {"id": 7, "file_name": "COCO_val2014_000000000007.jpg", "width": 100, "height": 80},
        ],
        "annotations": [
            {"image_id": 391895, "id": 1, "caption": "A man with a red helmet on a small moped on a dirt road. "},
            {"image_id": 522418, "id": 2, "caption": "A woman wearing a net on her head cutting a cake. "},
            {"image_id": 391895, "id": 3, "caption": "Man riding a motor bike on a dirt road on the countryside."},
        ],
    }
    return _write(tmp_path / "annotations" / "captions_val2014.json", data)


# ---- Karpathy ------------------------------------------------------------------------------------------------------


def test_load_karpathy_records(karpathy_json, tmp_path):
    ds = load_karpathy(karpathy_json, tmp_path / "coco")
    assert ds.name == "coco" and len(ds) == 4
    first = ds[0]
    assert first.image_id == "391895" and first.split == "train"
    assert first.path == tmp_path / "coco" / "train2014" / "COCO_train2014_000000000000.jpg"
    assert first.captions == (("a", "dog", "0", "0"), ("a", "dog", "0", "1"))
    assert first.width is None and first.height is None
    assert ds.get("184613").captions[-1] == ("a", "mans", "tshirt", "red")  # cleaned from 'raw'
    assert len(ds.get("184613").captions) == 3  # the empty one dropped
    assert ds.get("318219").captions == ()
    assert "522418" in ds and "0" not in ds


def test_karpathy_splits_and_restval(karpathy_json, tmp_path):
    ds = load_karpathy(karpathy_json, tmp_path)
    assert ds.splits() == {"train": 1, "restval": 1, "val": 1, "test": 1}
    assert [r.image_id for r in ds.split("train")] == ["391895", "522418"]
    assert [r.image_id for r in ds.split("restval")] == ["522418"]
    assert [r.image_id for r in ds.split("test")] == ["318219"]
    with pytest.raises(KeyError, match="no split 'dev'"):
        ds.split("dev")
    no_val = CaptionDataset([r for r in ds if r.split != "val"], "no-val")
    assert no_val.split("val") == []  # a standard split that is absent: empty, not an error
    assert len(list(ds.iter_captions("train"))) == 4
    vocab = build_vocab(ds.iter_captions("train"), min_count=2)
    assert vocab.words == ("0", "1", "a", "dog")  # all seen 4 times: ties are alphabetical


def test_karpathy_flickr_style_and_no_root(tmp_path):
    images = [_karpathy_image(5, "train", filepath=None), _karpathy_image(6, "test", filepath=None)]
    path = _write(tmp_path / "dataset_flickr8k.json", {"images": images})
    ds = load_karpathy(path, tmp_path / "Flicker8k_Dataset")
    assert ds.name == "dataset_flickr8k"  # no "dataset" field: the file stem
    assert ds[0].image_id == "5"  # no cocoid: imgid
    assert ds[0].path == tmp_path / "Flicker8k_Dataset" / "COCO_None_000000000005.jpg"
    assert load_karpathy(path, None)[0].path is None


def test_karpathy_optional_sizes(tmp_path):
    path = _write(tmp_path / "d.json", {"images": [_karpathy_image(0, "train", width=64, height=48)]})
    record = load_karpathy(path, tmp_path)[0]
    assert (record.width, record.height) == (64, 48)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.pop("images"), "missing key 'images'"),
        (lambda d: d.update(images={"a": 1}), "'images' must be list"),
        (lambda d: d["images"][1].pop("split"), r"images\[1\]: missing key 'split'"),
        (lambda d: d["images"][0].pop("filename"), r"images\[0\]: missing key 'filename'"),
        (lambda d: [d["images"][0].pop(k) for k in ("cocoid", "imgid")], "'cocoid' or 'imgid'"),
        (lambda d: d["images"][0]["sentences"][0].update(tokens="a dog"), r"sentences\[0\]: key 'tokens'"),
        (lambda d: d["images"][0]["sentences"][0].clear(), "neither 'tokens' nor 'raw'"),
        (lambda d: d["images"][0].update(sentences="oops"), "'sentences' must be list"),
        (lambda d: d["images"][0].update(width=-3), "'width' must be a positive integer"),
        (lambda d: d["images"][1].update(cocoid=391895), "appears twice"),
        (lambda d: d["images"].append(5), r"images\[2\]: expected a JSON object"),
    ],
)
def test_karpathy_errors_name_file_and_key(tmp_path, mutate, match):
    data = {"images": [_karpathy_image(0, "train", cocoid=391895), _karpathy_image(1, "val", cocoid=2)]}
    mutate(data)
    path = _write(tmp_path / "broken.json", data)
    with pytest.raises(DatasetError, match=match) as info:
        load_karpathy(path, tmp_path)
    assert "broken.json" in str(info.value)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_karpathy(tmp_path / "nope.json", tmp_path)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_coco_captions(tmp_path / "nope.json", tmp_path, "val")
    bad = _write(tmp_path / "bad.json", '{"images": [')
    with pytest.raises(DatasetError, match="bad.json: not valid JSON"):
        load_karpathy(bad, tmp_path)
    with pytest.raises(DatasetError, match="bad.json: not valid JSON"):
        load_dataset(bad)
    top = _write(tmp_path / "list.json", "[1, 2]")
    with pytest.raises(DatasetError, match="expected a JSON object"):
        load_karpathy(top, tmp_path)


# ---- COCO ----------------------------------------------------------------------------------------------------------


def test_load_coco_captions(coco_json, tmp_path):
    ds = load_coco_captions(coco_json, tmp_path / "val2014", "val")
    assert ds.name == "coco" and ds.splits() == {"val": 3}
    first = ds.get("391895")
    assert first.path == tmp_path / "val2014" / "COCO_val2014_000000391895.jpg"
    assert (first.width, first.height) == (640, 360)
    road = ("a", "man", "with", "a", "red", "helmet", "on", "a", "small", "moped", "on", "a", "dirt", "road")
    bike = ("man", "riding", "a", "motor", "bike", "on", "a", "dirt", "road", "on", "the", "countryside")
    assert first.captions == (road, bike)
    assert ds.get("7").captions == ()  # an image without annotations
    assert [r.image_id for r in ds] == ["391895", "522418", "7"]  # file order


def test_coco_image_info_file_without_annotations(tmp_path):
    path = _write(tmp_path / "image_info_test2014.json", {"images": [{"id": 1, "file_name": "x.jpg"}]})
    ds = load_coco_captions(path, None, "test")
    assert ds[0].captions == () and ds[0].path is None and ds[0].width is None


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d["images"][0].pop("file_name"), r"images\[0\]: missing key 'file_name'"),
        (lambda d: d["images"][1].pop("id"), r"images\[1\]: missing key 'id'"),
        (lambda d: d["annotations"][2].pop("caption"), r"annotations\[2\]: missing key 'caption'"),
        (lambda d: d["annotations"][0].update(caption=3), "'caption' must be str"),
        (lambda d: d["annotations"][1].update(image_id=999), "image_id 999 is not listed"),
        (lambda d: d["images"].append(dict(d["images"][0])), "appears twice"),
        (lambda d: d.update(annotations=None), "'annotations' must be list"),
    ],
)
def test_coco_errors_name_file_and_key(coco_json, tmp_path, mutate, match):
    data = json.loads(coco_json.read_text())
    mutate(data)
    _write(coco_json, data)
    with pytest.raises(DatasetError, match=match) as info:
        load_coco_captions(coco_json, tmp_path, "val")
    assert "captions_val2014.json" in str(info.value)


def test_coco_rejects_empty_split(coco_json, tmp_path):
    with pytest.raises(DatasetError, match="split"):
        load_coco_captions(coco_json, tmp_path, "")


# ---- load_dataset -------------------------------------------------------------------------------------------------


def test_load_dataset_directory(tmp_path):
    root = tmp_path / "scenes"
    _write(root / "dataset.json", {"dataset": "scenes", "images": [_karpathy_image(0, "train", filepath=None)]})
    ds = load_dataset(root)
    assert ds.name == "scenes" and ds[0].path == root / "COCO_None_000000000000.jpg"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="without a dataset.json"):
        load_dataset(empty)


def test_load_dataset_detects_formats(karpathy_json, coco_json, tmp_path):
    karpathy = load_dataset(karpathy_json)
    assert karpathy.splits()["restval"] == 1 and karpathy[0].path.parent == tmp_path / "train2014"
    coco = load_dataset(coco_json)  # annotations/captions_val2014.json -> split "val"
    assert coco.splits() == {"val": 3} and coco[0].path.parent == tmp_path / "annotations"
    (tmp_path / "val2014").mkdir()
    assert load_dataset(coco_json)[0].path.parent == tmp_path / "val2014"  # the sibling image folder when present
    odd = _write(tmp_path / "mycaps.json", json.loads(coco_json.read_text()))
    with pytest.raises(DatasetError, match="load_coco_captions"):
        load_dataset(odd)
    other = _write(tmp_path / "other.json", {"foo": 1})
    with pytest.raises(DatasetError, match="neither"):
        load_dataset(other)
    with pytest.raises(FileNotFoundError):
        load_dataset(tmp_path / "missing.json")


# ---- CaptionDataset ------------------------------------------------------------------------------------------------


def test_caption_dataset_behaviour():
    records = [ImageRecord("a", None, "train", (("x",),)), ImageRecord("b", None, "val", ())]
    ds = CaptionDataset(records, "tiny")
    assert list(ds) == records and ds.get("b") is records[1]
    assert ds.subset(["b"]).records == [records[1]]
    with pytest.raises(KeyError, match="'zz' is not in dataset 'tiny'"):
        ds.get("zz")
    with pytest.raises(DatasetError, match="twice"):
        CaptionDataset([records[0], records[0]], "dup")
    with pytest.raises(dataclasses.FrozenInstanceError):
        records[0].split = "test"  # type: ignore[misc]
    assert "tiny" in repr(ds)
