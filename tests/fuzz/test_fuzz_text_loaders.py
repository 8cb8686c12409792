"""Fuzz the JSON loaders users point at their own files: vocabularies and caption datasets (Karpathy, COCO).

Property: every input loads or raises the module's documented error (``VocabError`` / ``DatasetError``; both are
``ValueError`` subclasses); nothing else escapes, and nothing hangs (the profile's ``deadline``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgecap.runtime.vocab import VocabError, build_vocab, load_vocab
from edgecap.workshop.data.datasets import DatasetError, load_coco_captions, load_dataset, load_karpathy

from .strategies import byte_mutations, json_values, mutated_json

CAPTIONS = [["a", "dog", "on", "grass"], ["a", "cat", "on", "a", "mat"], ["two", "dogs", "run"]]
WORD_VOCAB = build_vocab(CAPTIONS, kind="word", min_count=1).to_dict()
RADIX_VOCAB = build_vocab(CAPTIONS, kind="radix", min_count=1).to_dict()

KARPATHY = {
    "dataset": "coco",
    "images": [
        {
            "cocoid": 1,
            "imgid": 0,
            "filepath": "val2014",
            "filename": "a.jpg",
            "split": "test",
            "sentences": [{"tokens": ["a", "dog"], "raw": "A dog."}, {"raw": "A brown dog."}],
        },
        {"imgid": 7, "filename": "b.jpg", "split": "train", "sentences": [{"tokens": ["a", "cat"]}]},
    ],
}
COCO = {
    "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}, {"id": "2", "file_name": "b.jpg"}],
    "annotations": [{"image_id": 1, "caption": "A dog on grass."}, {"image_id": "2", "caption": "A cat."}],
}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-json")


def _dump(doc: object) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


def _vocab(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    try:
        vocab = load_vocab(path)
    except VocabError:
        return
    assert vocab.size >= 3  # pad/bos/eos at least
    vocab.decode(vocab.encode(["a", "dog"]))


def test_vocab_seeds_load(work: Path) -> None:
    for seed in (WORD_VOCAB, RADIX_VOCAB):
        (work / "vocab.json").write_bytes(_dump(seed))
        assert load_vocab(work / "vocab.json").kind == seed["kind"]


@given(doc=st.sampled_from([WORD_VOCAB, RADIX_VOCAB]).flatmap(mutated_json))
def test_vocab_mutated_fields(work: Path, doc: object) -> None:
    _vocab(work / "vocab.json", _dump(doc))


@given(data=st.sampled_from([_dump(WORD_VOCAB), _dump(RADIX_VOCAB)]).flatmap(byte_mutations) | st.binary(max_size=64))
def test_vocab_mutated_bytes(work: Path, data: bytes) -> None:
    _vocab(work / "vocab.json", data)


def _datasets(work: Path, data: bytes) -> None:
    """The same bytes through every reader: Karpathy, COCO and the auto-detecting load_dataset."""
    karpathy, coco = work / "dataset.json", work / "captions_val2014.json"
    karpathy.write_bytes(data)
    coco.write_bytes(data)
    loaders = [
        lambda: load_karpathy(karpathy, work),
        lambda: load_coco_captions(coco, work, "val"),
        lambda: load_dataset(karpathy),
        lambda: load_dataset(coco),
    ]
    for load in loaders:
        try:
            dataset = load()
        except DatasetError:
            continue
        for record in dataset:
            assert isinstance(record.image_id, str) and all(isinstance(w, str) for c in record.captions for w in c)


def test_dataset_seeds_load(work: Path) -> None:
    (work / "dataset.json").write_bytes(_dump(KARPATHY))
    assert len(load_karpathy(work / "dataset.json", work)) == 2
    (work / "captions_val2014.json").write_bytes(_dump(COCO))
    assert len(load_coco_captions(work / "captions_val2014.json", work, "val")) == 2


@given(doc=st.sampled_from([KARPATHY, COCO]).flatmap(mutated_json) | json_values)
def test_dataset_mutated_fields(work: Path, doc: object) -> None:
    _datasets(work, _dump(doc))


@given(data=st.sampled_from([_dump(KARPATHY), _dump(COCO)]).flatmap(byte_mutations))
def test_dataset_mutated_bytes(work: Path, data: bytes) -> None:
    _datasets(work, data)
