"""Training gives bit-identical weights for the same seed and thread count, even while another process loads every
core; the feature cache does too, whatever its decoding worker count. The comparison is shown to catch a data order
that is not seeded."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import edgecap.workshop.training.loop as loop
from edgecap.workshop.training.determinism import TRAIN_THREADS_ENV, make_deterministic, train_threads
from tests.workshop.training.helpers import tiny_train_cfg

_SPIN = "import os, time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"


@contextmanager
def competing_load(seconds: float = 20.0) -> Iterator[None]:
    """One busy process per core, each ending on its own after ``seconds`` and killed on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN.format(seconds=seconds)]) for _ in range(2)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


def _train(tiny_data, out: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    cfg = tiny_train_cfg(tiny_data, out, epochs=2, max_steps=4, save_every_steps=0, seed=seed)
    return load_file(str(loop.train(cfg, progress=False) / "weights.safetensors"))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_training_under_load_gives_bit_identical_weights(tiny_data, tmp_path: Path) -> None:
    quiet = _train(tiny_data, tmp_path / "quiet")
    with competing_load():
        busy = _train(tiny_data, tmp_path / "busy")
    assert _same(quiet, busy)
    assert not _same(quiet, _train(tiny_data, tmp_path / "seed1", seed=1))  # the weights do depend on the seed


def test_the_comparison_catches_an_unseeded_data_order(tiny_data, tmp_path: Path, monkeypatch) -> None:
    def unseeded(num_items: int, seed: int, epoch: int, ctx) -> list[int]:
        return np.random.default_rng().permutation(num_items).tolist()  # fresh OS entropy every call

    monkeypatch.setattr(loop, "epoch_order", unseeded)
    assert not _same(_train(tiny_data, tmp_path / "a"), _train(tiny_data, tmp_path / "b"))


def test_the_thread_count_comes_from_a_setting(monkeypatch) -> None:
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv(TRAIN_THREADS_ENV, "1")
        assert train_threads() == 1 and train_threads(2) == 2
        record = make_deterministic()
        assert record["threads"] == torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()
        monkeypatch.setenv(TRAIN_THREADS_ENV, "many")
        with pytest.raises(ValueError, match=TRAIN_THREADS_ENV):
            train_threads()
    finally:
        torch.set_num_threads(before)
        torch.use_deterministic_algorithms(False)


def test_feature_extraction_is_bit_identical_under_load_and_any_worker_count(tiny_data, tmp_path: Path) -> None:
    from edgecap.workshop.data.feature_cache import extract_features
    from edgecap.workshop.models.backbone import create_backbone

    data, _ = tiny_data
    torch.manual_seed(0)
    backbone = create_backbone("test_efficientnet", pretrained=False, image_size=64)
    extract_features(data, tmp_path / "a", progress=False, backbone=backbone, num_workers=0, shard_size=16)
    with competing_load():
        extract_features(data, tmp_path / "b", progress=False, backbone=backbone, num_workers=2, shard_size=16)
    shards = sorted(p.name for p in (tmp_path / "a").glob("shard_*.safetensors"))
    assert shards and shards == sorted(p.name for p in (tmp_path / "b").glob("shard_*.safetensors"))
    for name in shards:
        assert _same(load_file(str(tmp_path / "a" / name)), load_file(str(tmp_path / "b" / name)))
    assert (tmp_path / "a" / "index.json").read_text() == (tmp_path / "b" / "index.json").read_text()
