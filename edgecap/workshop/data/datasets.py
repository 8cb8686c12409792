"""Caption dataset readers: Karpathy split files and COCO caption annotations, read into one record type.

Two formats cover the public captioning data:

* Karpathy's ``dataset_coco.json`` / ``dataset_flickr30k.json`` (the splits every captioning paper reports on):
  ``{"dataset": ..., "images": [{"filepath"?, "filename", "imgid", "cocoid"?, "split", "sentences":
  [{"tokens", "raw"}, ...]}]}``. Its ``restval`` split is the 30k COCO val2014 images that the "Karpathy train"
  split (113,287 images) adds to train2014, so :meth:`CaptionDataset.split` folds it into ``"train"``.
* COCO's ``captions_{train,val}2014.json``: ``{"images": [{"id", "file_name", "width", "height"}],
  "annotations": [{"image_id", "id", "caption"}]}``; ``image_info_test*.json`` files have no ``annotations``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecap.runtime.text import clean_caption

__all__ = [
    "CaptionDataset",
    "DatasetError",
    "ImageRecord",
    "load_coco_captions",
    "load_dataset",
    "load_karpathy",
]

# Karpathy's "restval" images are training images (Vinyals et al. / Karpathy & Fei-Fei split).
_SPLIT_ALIASES: dict[str, tuple[str, ...]] = {"train": ("train", "restval")}
_STANDARD_SPLITS = frozenset({"train", "restval", "val", "test"})


class DatasetError(ValueError):
    """A dataset file is malformed: invalid JSON, a missing key, a value of the wrong type."""


@dataclass(frozen=True)
class ImageRecord:
    """One image and its reference captions.

    Attributes:
        image_id: dataset-wide id (COCO id as a string when known).
        path: image file, or ``None`` for feature-only datasets (no image root given).
        split: ``"train"``, ``"restval"``, ``"val"``, ``"test"``, ...
        captions: tokenised reference captions (possibly none, e.g. for test images).
        width, height: image size in pixels when the annotations give it (needed to normalise region boxes).
    """

    image_id: str
    path: Path | None
    split: str
    captions: tuple[tuple[str, ...], ...]
    width: int | None = None
    height: int | None = None


class CaptionDataset:
    """An ordered list of :class:`ImageRecord` with unique ids, addressable by split and by id.

    Args:
        records: the images, in file order.
        name: a label (e.g. ``"coco"``), recorded in run metadata.

    Raises:
        DatasetError: two records share an ``image_id``.
    """

    def __init__(self, records: Sequence[ImageRecord], name: str) -> None:
        self.records: list[ImageRecord] = list(records)
        self.name = name
        self._by_id: dict[str, ImageRecord] = {}
        for record in self.records:
            if record.image_id in self._by_id:
                raise DatasetError(f"dataset {name!r}: image id {record.image_id!r} appears twice")
            self._by_id[record.image_id] = record

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[ImageRecord]:
        return iter(self.records)

    def __getitem__(self, index: int) -> ImageRecord:
        return self.records[index]

    def __contains__(self, image_id: object) -> bool:
        return image_id in self._by_id

    def __repr__(self) -> str:
        return f"CaptionDataset(name={self.name!r}, splits={self.splits()})"

    def get(self, image_id: str) -> ImageRecord:
        """The record of ``image_id``; ``KeyError`` naming the dataset when absent."""
        try:
            return self._by_id[image_id]
        except KeyError:
            raise KeyError(f"image id {image_id!r} is not in dataset {self.name!r}") from None

    def split(self, name: str) -> list[ImageRecord]:
        """Records of split ``name``, in file order; ``"train"`` includes Karpathy's ``"restval"``.

        A standard split (``train``, ``restval``, ``val``, ``test``) that the dataset lacks gives an empty list.

        Raises:
            KeyError: ``name`` is neither a standard split nor present (likely a typo; the message lists the splits).
        """
        members = _SPLIT_ALIASES.get(name, (name,))
        out = [r for r in self.records if r.split in members]
        if not out and name not in _STANDARD_SPLITS:
            raise KeyError(f"dataset {self.name!r} has no split {name!r}; splits: {self.splits()}")
        return out

    def splits(self) -> dict[str, int]:
        """Images per split *as stored* (``restval`` listed on its own), in first-seen order."""
        return dict(Counter(r.split for r in self.records))

    def iter_captions(self, split: str | None = None) -> Iterator[tuple[str, ...]]:
        """Every reference caption of ``split`` (all splits when ``None``): the input of ``build_vocab``."""
        for record in self.records if split is None else self.split(split):
            yield from record.captions

    def subset(self, image_ids: Iterable[str], name: str | None = None) -> CaptionDataset:
        """A dataset holding only ``image_ids`` (in the given order)."""
        return CaptionDataset([self.get(i) for i in image_ids], name or self.name)


# --------------------------------------------------------------------------------------------------------------------
# JSON helpers that name the file and the entry in every error


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DatasetError(f"{path}: not valid JSON ({err})") from None


def _get(obj: Any, key: str, where: str, types: type | tuple[type, ...]) -> Any:
    if not isinstance(obj, Mapping):
        raise DatasetError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise DatasetError(f"{where}: missing key {key!r}")
    value = obj[key]
    if not isinstance(value, types) or isinstance(value, bool):
        expected = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise DatasetError(f"{where}: key {key!r} must be {expected}, got {type(value).__name__}")
    return value


def _opt_size(obj: Mapping[str, Any], key: str, where: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise DatasetError(f"{where}: key {key!r} must be a positive integer, got {value!r}")
    return value


def _resolve(image_root: Path | None, *parts: str) -> Path | None:
    return None if image_root is None else image_root.joinpath(*parts)


# --------------------------------------------------------------------------------------------------------------------
# Karpathy


def _karpathy_sentence(sentence: Any, where: str) -> tuple[str, ...]:
    """Karpathy's ``tokens`` are the reference tokenisation and are used as given; ``raw`` is cleaned otherwise."""
    if not isinstance(sentence, Mapping):
        raise DatasetError(f"{where}: expected a JSON object, got {type(sentence).__name__}")
    tokens = sentence.get("tokens")
    if tokens is not None:
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise DatasetError(f"{where}: key 'tokens' must be a list of strings")
        return tuple(t for t in tokens if t)
    if "raw" not in sentence:
        raise DatasetError(f"{where}: sentence has neither 'tokens' nor 'raw'")
    return tuple(clean_caption(_get(sentence, "raw", where, str)))


def load_karpathy(json_path: str | Path, image_root: str | Path | None) -> CaptionDataset:
    """Read a Karpathy split file (``dataset_coco.json``, ``dataset_flickr8k/30k.json`` or our own).

    Args:
        json_path: the split file.
        image_root: directory the image paths are relative to: ``image_root/filepath/filename`` (COCO) or
            ``image_root/filename`` when an entry has no ``filepath`` (Flickr). ``None``: records get no path.

    Returns:
        A dataset named after the file's ``"dataset"`` field (the file stem when absent). ``image_id`` is the
        ``cocoid`` when present, else ``imgid``; empty captions are dropped.

    Raises:
        FileNotFoundError: ``json_path`` does not exist.
        DatasetError: invalid JSON, or a missing / mistyped key (the message names the file, entry and key).
    """
    json_path = Path(json_path)
    return _karpathy_from_data(_read_json(json_path), json_path, None if image_root is None else Path(image_root))


def _karpathy_from_data(data: Any, json_path: Path, root: Path | None) -> CaptionDataset:
    images = _get(data, "images", str(json_path), list)
    records: list[ImageRecord] = []
    seen: set[str] = set()
    for n, entry in enumerate(images):
        where = f"{json_path}: images[{n}]"
        if not isinstance(entry, Mapping):
            raise DatasetError(f"{where}: expected a JSON object, got {type(entry).__name__}")
        if entry.get("cocoid") is not None:
            image_id = str(_get(entry, "cocoid", where, (int, str)))
        elif entry.get("imgid") is not None:
            image_id = str(_get(entry, "imgid", where, (int, str)))
        else:
            raise DatasetError(f"{where}: missing key 'cocoid' or 'imgid' (the image id)")
        if image_id in seen:
            raise DatasetError(f"{where}: image id {image_id} appears twice")
        seen.add(image_id)
        path = None
        if root is not None:
            filename = _get(entry, "filename", where, str)
            filepath = entry.get("filepath")
            if filepath is not None and not isinstance(filepath, str):
                raise DatasetError(f"{where}: key 'filepath' must be str, got {type(filepath).__name__}")
            path = _resolve(root, filepath, filename) if filepath else _resolve(root, filename)
        sentences = _get(entry, "sentences", where, list) if "sentences" in entry else []
        captions = tuple(
            caption
            for k, sentence in enumerate(sentences)
            if (caption := _karpathy_sentence(sentence, f"{where}.sentences[{k}]"))
        )
        records.append(
            ImageRecord(
                image_id=image_id,
                path=path,
                split=_get(entry, "split", where, str),
                captions=captions,
                width=_opt_size(entry, "width", where),
                height=_opt_size(entry, "height", where),
            )
        )
    name = data.get("dataset") if isinstance(data.get("dataset"), str) else json_path.stem
    return CaptionDataset(records, name)


# --------------------------------------------------------------------------------------------------------------------
# COCO captions


def load_coco_captions(captions_json: str | Path, image_root: str | Path | None, split: str) -> CaptionDataset:
    """Read a COCO captions file (``captions_train2014.json``) or image-info file (``image_info_test2014.json``).

    Args:
        captions_json: the annotation file.
        image_root: the image directory (``.../train2014``); records get ``image_root/file_name``, or no path when
            ``None``.
        split: the split name given to every record (the file itself does not say).

    Returns:
        A dataset named ``"coco"``, images in file order, captions cleaned with
        :func:`~edgecap.runtime.text.clean_caption` in annotation order; images without annotations get no captions.

    Raises:
        FileNotFoundError: ``captions_json`` does not exist.
        DatasetError: invalid JSON, a missing / mistyped key, or an annotation for an image the file does not list.
    """
    captions_json = Path(captions_json)
    if not isinstance(split, str) or not split:
        raise DatasetError(f"split must be a non-empty string, got {split!r}")
    root = None if image_root is None else Path(image_root)
    return _coco_from_data(_read_json(captions_json), captions_json, root, split)


def _coco_from_data(data: Any, captions_json: Path, root: Path | None, split: str) -> CaptionDataset:
    images = _get(data, "images", str(captions_json), list)
    annotations = _get(data, "annotations", str(captions_json), list) if "annotations" in data else []

    grouped: dict[str, list[tuple[str, ...]]] = {}
    info: list[tuple[str, str, int | None, int | None]] = []
    for n, entry in enumerate(images):
        where = f"{captions_json}: images[{n}]"
        image_id = str(_get(entry, "id", where, (int, str)))
        if image_id in grouped:
            raise DatasetError(f"{where}: image id {image_id} appears twice")
        grouped[image_id] = []
        file_name = _get(entry, "file_name", where, str)
        info.append((image_id, file_name, _opt_size(entry, "width", where), _opt_size(entry, "height", where)))

    for n, ann in enumerate(annotations):
        where = f"{captions_json}: annotations[{n}]"
        image_id = str(_get(ann, "image_id", where, (int, str)))
        if image_id not in grouped:
            raise DatasetError(f"{where}: image_id {image_id} is not listed under 'images'")
        words = clean_caption(_get(ann, "caption", where, str))
        if words:
            grouped[image_id].append(tuple(words))

    records = [
        ImageRecord(
            image_id=image_id,
            path=_resolve(root, file_name),
            split=split,
            captions=tuple(grouped[image_id]),
            width=width,
            height=height,
        )
        for image_id, file_name, width, height in info
    ]
    return CaptionDataset(records, "coco")


# --------------------------------------------------------------------------------------------------------------------
# Auto-detection


def _is_karpathy(data: Any) -> bool:
    images = data.get("images") if isinstance(data, Mapping) else None
    if not isinstance(images, list) or "annotations" in data:
        return False
    return not images or (isinstance(images[0], Mapping) and "sentences" in images[0])


def _coco_split_and_root(path: Path) -> tuple[str, Path]:
    """``captions_val2014.json`` → split ``"val"``, images in a ``val2014`` folder beside the file or its parent."""
    match = re.search(r"(train|val|test)(\d{4})?", path.stem)
    if match is None:
        raise DatasetError(
            f"{path}: cannot tell the split of a COCO captions file from its name; "
            "call load_coco_captions(path, image_root, split) instead"
        )
    split, folder = match.group(1), match.group(0)
    for candidate in (path.parent / folder, path.parent.parent / folder):
        if candidate.is_dir():
            return split, candidate
    return split, path.parent


def load_dataset(path: str | Path) -> CaptionDataset:
    """Load a dataset from a directory or a JSON file, detecting the format.

    * a directory: its ``dataset.json`` (Karpathy format), images relative to the directory;
    * a Karpathy-format JSON file: images relative to the file's directory;
    * a COCO captions JSON file: split from the file name (``captions_val2014.json`` → ``"val"``), images in a
      ``val2014`` folder beside the file (or beside its ``annotations/`` folder), else the file's directory.

    Raises:
        FileNotFoundError: ``path`` (or the directory's ``dataset.json``) does not exist.
        DatasetError: the JSON is invalid or in neither format.
    """
    path = Path(path)
    if path.is_dir():
        json_path = path / "dataset.json"
        if not json_path.is_file():
            raise FileNotFoundError(f"{path} is a directory without a dataset.json (Karpathy format)")
        return load_karpathy(json_path, path)
    data = _read_json(path)
    if _is_karpathy(data):
        return _karpathy_from_data(data, path, path.parent)
    if isinstance(data, Mapping) and isinstance(data.get("images"), list):
        split, root = _coco_split_and_root(path)
        return _coco_from_data(data, path, root, split)
    raise DatasetError(f"{path}: neither a Karpathy split file nor a COCO captions file (no 'images' list)")
