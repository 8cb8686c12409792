"""One smoke test per pipeline command through click, on a tiny backbone so the pixel path runs end to end."""

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from edgecap.cli import main
from edgecap.workshop.models.backbone import create_backbone

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.fixture(scope="module")
def pipeline(tiny_data, tmp_path_factory):
    data, _ = tiny_data
    root = tmp_path_factory.mktemp("pipeline")
    torch.manual_seed(0)
    weights = root / "backbone.safetensors"
    save_file(create_backbone("test_efficientnet", pretrained=False, image_size=64).model.state_dict(), weights)
    runner = CliRunner()
    cache = root / "cache"
    result = runner.invoke(
        main,
        [
            "features",
            "--data",
            str(data),
            "--backbone",
            "test_efficientnet",
            "--size",
            "64",
            "--weights",
            str(weights),
            "--out",
            str(cache),
            "--batch-size",
            "16",
        ],
    )
    assert result.exit_code == 0, result.output
    run = root / "run"
    result = runner.invoke(
        main,
        [
            "train",
            "--model",
            "ort-test",
            "--data",
            str(data),
            "--features",
            str(cache),
            "--out",
            str(run),
            "--epochs",
            "1",
            "--batch-size",
            "16",
            "--optimizer",
            "adamw",
            "--lr",
            "0.003",
            "--warmup",
            "2",
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 0, result.output
    return data, weights, run


def test_eval_prints_json_metrics(pipeline):
    _, _, run = pipeline
    result = CliRunner().invoke(
        main, ["eval", str(run), "--split", "test", "--beam", "2", "--tokenizer", "simple", "--json", "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    scores = json.loads(result.output)["metrics"]
    assert scores["CIDEr-D"] is not None and scores["BLEU-4"] is not None


def test_caption_from_pixels_matches_python_api(pipeline):
    from edgecap import Captioner

    data, weights, run = pipeline
    images = sorted((data / "images").iterdir())[:3]
    result = CliRunner().invoke(
        main,
        [
            "caption",
            *map(str, images),
            "--model",
            str(run),
            "--beam",
            "2",
            "--backbone-weights",
            str(weights),
            "--json",
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 0, result.output
    cli_captions = json.loads(result.output)
    captioner = Captioner.from_run(run, beam=2, backbone_weights=weights)
    assert list(cli_captions.values()) == captioner.batch([str(p) for p in images])
    assert captioner(images[0]) == cli_captions[str(images[0])]


def test_caption_without_the_backbone_weights_says_what_is_missing(pipeline):
    data, _, run = pipeline
    image = next((data / "images").iterdir())
    result = CliRunner().invoke(main, ["caption", str(image), "--model", str(run)])
    assert result.exit_code != 0 and "backbone-weights" not in result.output  # message names the weights file
    assert "backbone.safetensors" in result.output


def test_caption_rejects_a_corrupt_image(pipeline, tmp_path: Path):
    _, weights, run = pipeline
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    result = CliRunner().invoke(main, ["caption", str(bad), "--model", str(run), "--backbone-weights", str(weights)])
    assert result.exit_code != 0 and "broken.jpg" in result.output


def test_train_refuses_a_missing_feature_cache(tiny_data, tmp_path):
    data, _ = tiny_data
    result = CliRunner().invoke(main, ["train", "--data", str(data), "--features", str(tmp_path / "none")])
    assert result.exit_code != 0 and "edgecap features" in result.output


def test_train_rejects_an_unknown_model(tiny_data):
    data, feats = tiny_data
    result = CliRunner().invoke(main, ["train", "--model", "nope", "--data", str(data), "--features", str(feats)])
    assert result.exit_code != 0 and "edgecap zoo" in result.output
