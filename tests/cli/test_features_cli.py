"""``edgecap features``: one smoke run through the lazy CLI group, plus its error messages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from edgecap.cli import main
from edgecap.workshop.data.feature_cache import FeatureCache

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    entries = []
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (48, 60, 3), dtype=np.uint8)).save(root / "images" / f"{i}.jpg")
        entries.append({"filepath": "images", "filename": f"{i}.jpg", "imgid": i, "split": "train", "sentences": []})
    (root / "dataset.json").write_text(json.dumps({"images": entries}))
    return root


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    path = tmp_path / "tiny.safetensors"
    save_file(timm.create_model("test_efficientnet", pretrained=False).state_dict(), str(path))
    return path


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["features", *args])
    return result.exit_code, result.output


def test_features_command_builds_and_reuses_a_cache(dataset: Path, weights: Path) -> None:
    args = ["--data", str(dataset), "--backbone", "test_efficientnet", "--weights", str(weights), "--size", "64"]
    code, output = _run(*args, "--batch-size", "2")
    assert code == 0, output
    assert "5 images cached (5 extracted now, 0 skipped)" in output and "kB/image" in output
    cache = FeatureCache(dataset / "features" / "test_efficientnet-64")
    assert len(cache) == 5 and cache.spec["weights"]["file"] == "tiny.safetensors"

    code, output = _run(*args)
    assert code == 0 and "0 extracted now" in output and "nothing to extract" in output

    code, output = _run(*args, "--dtype", "float32")
    assert code == 1 and "dtype: cache has 'float16'" in output and "--overwrite" in output
    code, output = _run(*args, "--dtype", "float32", "--overwrite")
    assert code == 0 and "5 extracted now" in output and FeatureCache(cache.dir).dtype == "float32"


def test_features_command_errors(dataset: Path, weights: Path, tmp_path: Path) -> None:
    code, output = _run("--data", str(dataset), "--backbone", "test_efficientnet", "--out", str(tmp_path / "c"))
    assert code == 1 and "no offline pretrained weights" in output and "Traceback" not in output

    (dataset / "images" / "3.jpg").write_bytes(b"\xff\xd8\xff garbage")
    base = ["--data", str(dataset), "--backbone", "test_efficientnet", "--weights", str(weights), "--size", "64"]
    code, output = _run(*base, "--out", str(tmp_path / "c"))
    assert code == 1 and "3.jpg" in output and "--skip-bad" in output

    code, output = _run(*base, "--out", str(tmp_path / "c"), "--skip-bad")
    assert code == 0 and "4 images cached (4 extracted now, 1 skipped)" in output
