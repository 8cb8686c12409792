import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from edgecap.workshop.training import checkpoint as ckpt
from edgecap.workshop.training.config import TrainCfg
from edgecap.workshop.training.loop import train
from tests.workshop.training.helpers import tiny_train_cfg


def _cfg(tiny_data, out: Path, **kw) -> TrainCfg:
    return tiny_train_cfg(tiny_data, out, **kw)


def _train_losses(run: Path) -> list[float]:
    lines = [json.loads(x) for x in (run / ckpt.METRICS).read_text().splitlines()]
    return [x["loss"] for x in lines if x["event"] == "train"]


def test_tiny_model_loss_falls_and_run_is_complete(tiny_data, tmp_path):
    run = train(_cfg(tiny_data, tmp_path / "run", max_steps=40), progress=False)
    losses = _train_losses(run)
    assert losses[-1] < losses[0] - 1.0
    for name in (ckpt.CONFIG, ckpt.VOCAB, ckpt.WEIGHTS, "summary.json"):
        assert (run / name).is_file(), name
    config = json.loads((run / ckpt.CONFIG).read_text())
    assert config["model"]["name"] == "acort-test" and config["model"]["feature_dim"] == 24
    events = [json.loads(x)["event"] for x in (run / ckpt.METRICS).read_text().splitlines()]
    assert "val" in events


def test_resume_continues_exactly_where_it_stopped(tiny_data, tmp_path):
    straight = train(_cfg(tiny_data, tmp_path / "straight", max_steps=12), progress=False)
    # Crash-free interruption: stop after 7 steps, then resume to 12 with the same config.
    resumed_dir = tmp_path / "resumed"
    train(_cfg(tiny_data, resumed_dir, max_steps=7), progress=False)
    state = torch.load(resumed_dir / ckpt.LAST / "state.pt", weights_only=True)
    assert state["progress"]["step"] == 7
    train(_cfg(tiny_data, resumed_dir, max_steps=12), progress=False)
    a = load_file(straight / ckpt.LAST / ckpt.WEIGHTS)
    b = load_file(resumed_dir / ckpt.LAST / ckpt.WEIGHTS)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def test_interrupted_checkpoint_write_keeps_previous(tiny_data, tmp_path, monkeypatch):
    run = train(_cfg(tiny_data, tmp_path / "run", max_steps=4), progress=False)
    before = (run / ckpt.LAST / "state.pt").read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        train(_cfg(tiny_data, run, max_steps=6), progress=False)
    assert (run / ckpt.LAST / "state.pt").read_bytes() == before
    assert not [p for p in (run / "checkpoints").iterdir() if p.name != "last"]


def test_resume_refuses_a_run_of_another_model(tiny_data, tmp_path):
    run = train(_cfg(tiny_data, tmp_path / "run", max_steps=2), progress=False)
    with pytest.raises(ckpt.RunError, match="acort-test"):
        train(_cfg(tiny_data, run, model="ort-test", model_overrides={}, max_steps=2), progress=False)


def test_unknown_optimizer_is_rejected(tiny_data, tmp_path):
    with pytest.raises(ValueError, match="optimizer"):
        train(_cfg(tiny_data, tmp_path / "run", optimizer="sgdx", max_steps=1), progress=False)


def _cli_train(tiny_data, run: Path, *extra: str):
    from click.testing import CliRunner

    from edgecap.cli import main

    data, feats = tiny_data
    args = ["train", "--model", "acort-test", "--data", str(data), "--features", str(feats), "--out", str(run)]
    args += ["--set", "radix_base=64", "--epochs", "1", "--batch-size", "8", "--optimizer", "adamw", "--max-steps"]
    return CliRunner().invoke(main, [*args, *extra], catch_exceptions=False)


@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_resume_from_a_corrupt_checkpoint_names_it_and_rewrites_nothing(tiny_data, tmp_path, damage):
    run = tmp_path / "run"
    first = _cli_train(tiny_data, run, "2")
    assert first.exit_code == 0, first.output
    state = run / ckpt.LAST / ckpt.STATE
    good = state.read_bytes()
    state.write_bytes(b"not a zip archive at all" if damage == "corrupt" else good[: len(good) // 2])
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}

    result = _cli_train(tiny_data, run, "4", "--seed", "5")  # a changed config must not be written either
    assert result.exit_code != 0
    assert str(state) in result.output and "--no-resume" in result.output
    assert "Traceback" not in result.output
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before

    fresh = _cli_train(tiny_data, run, "2", "--no-resume")
    assert fresh.exit_code == 0, fresh.output
    assert torch.load(state, weights_only=True)["progress"]["step"] == 2
