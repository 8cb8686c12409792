"""The Image Transformer trains through the shared loop and CLI: ``edgecap train --model image-transformer-test`` on
the tiny synthetic set with falling loss, then its run decodes with the cached step."""

from __future__ import annotations

import json

from click.testing import CliRunner

from edgecap.cli import main
from edgecap.workshop.training import checkpoint as ckpt


def test_cli_training_loss_falls(tiny_data, tmp_path) -> None:
    data, feats = tiny_data
    run = tmp_path / "run"
    args = ["train", "--model", "image-transformer-test", "--data", str(data), "--features", str(feats)]
    args += ["--out", str(run), "--epochs", "40", "--max-steps", "40", "--batch-size", "8", "--optimizer", "adamw"]
    args += ["--lr", "0.01", "--warmup", "5", "--device", "cpu", "--seed", "1"]
    args += ["--set", "feature_dropout=0", "--set", "output_dropout=0.1"]  # toy data: let 40 steps fit it
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in (run / ckpt.METRICS).read_text().splitlines()]
    losses = [x["loss"] for x in lines if x["event"] == "train"]
    assert len(losses) >= 10
    assert losses[-1] < losses[0] - 1.0
    config = json.loads((run / ckpt.CONFIG).read_text())
    assert config["model"]["name"] == "image-transformer-test"
    assert config["model"].get("family", "image_transformer") == "image_transformer"
