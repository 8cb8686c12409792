"""Suite-wide settings and shared fixtures.

One torch thread per test process (pytest-xdist runs one process per core); ``tiny_data`` is a small synthetic
dataset with per-image region features (bottom-up layout), built once per session.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from edgecap.workshop.data.synthetic import generate_dataset

torch.set_num_threads(1)


@pytest.fixture
def flush_denormals():
    """Randomly initialised conv nets produce denormal activations that make CPU convolutions ~40x slower."""
    torch.set_flush_denormal(True)
    yield
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    dataset_json = generate_dataset(root / "data", 40, seed=3, progress=False)
    feats = root / "regions"
    feats.mkdir()
    rng = np.random.default_rng(0)
    for image in json.loads(dataset_json.read_text())["images"]:
        n = int(rng.integers(4, 9))
        xy = rng.uniform(0, 200, size=(n, 2))
        wh = rng.uniform(10, 56, size=(n, 2))
        np.savez(
            feats / f"{image['cocoid']}.npz",
            feat=rng.normal(size=(n, 24)).astype(np.float32),
            bbox=np.concatenate([xy, xy + wh], axis=1).astype(np.float32),
            image_w=256,
            image_h=256,
        )
    return root / "data", feats


@pytest.fixture
def tiny_parent_run(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny trained ``acort-test`` run (trained once per process) that compression tests derive runs from."""
    from tests.workshop.compression.prune_helpers import tiny_run_dir

    return tiny_run_dir(tiny_data, tmp_path_factory)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``slow`` tests are collected by every run (tests/test_collection.py counts them) but run only when ``-m``
    names them: ``.ci/run`` runs ``python -m pytest -q -n 2 -m slow`` as its own job after the README's command."""
    markexpr = config.option.markexpr or ""
    if "slow" in markexpr and "not slow" not in markexpr:
        return
    skip = pytest.mark.skip(reason="slow: run with `python -m pytest -m slow` (CI's second job)")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
