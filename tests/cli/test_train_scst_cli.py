import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from edgecap.cli import main
from edgecap.workshop.training import checkpoint as ckpt
from edgecap.workshop.training.scst_loop import SCST_STATE, SCST_SUMMARY, XE_WEIGHTS

ROOT = Path(__file__).resolve().parents[2]


def _common(tiny_data, out: Path) -> list[str]:
    data, feats = tiny_data
    return [
        "train", "--model", "acort-test", "--data", str(data), "--features", str(feats), "--out", str(out),
        "--batch-size", "8", "--optimizer", "adamw", "--lr", "3e-3", "--warmup", "5", "--set", "radix_base=64",
        "--device", "cpu", "--threads", "1",
    ]  # fmt: skip


def test_train_then_scst_from_the_command_line(tiny_data, tmp_path):
    out = tmp_path / "run"
    args = _common(tiny_data, out) + ["--epochs", "1", "--scst-epochs", "1", "--scst-max-steps", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / SCST_SUMMARY).read_text())
    assert summary["steps"] == 2 and (out / XE_WEIGHTS).is_file()
    config = json.loads((out / ckpt.CONFIG).read_text())
    assert config["train"]["scst_samples"] == 5 and config["train"]["scst_optimizer"] == "radam"  # the v2 recipe

    # train scst RUN: SCST on a copy, with a recipe file over the ACORT recipe; the source run is left untouched.
    copy = tmp_path / "copy"
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"base": "acort", "scst_samples": 3}))
    before = (out / ckpt.WEIGHTS).read_bytes()
    args = ["train", "scst", str(out), "--out", str(copy), "--epochs", "1", "--max-steps", "1",
            "--recipe", str(recipe), "--batch-size", "8", "--device", "cpu"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    stored = json.loads((copy / ckpt.CONFIG).read_text())["train"]
    assert stored["scst_samples"] == 3 and stored["scst_bleu_weight"] == 1.0 and stored["out"] == str(copy)
    assert stored["scst_epochs"] == 1 and stored["scst_max_steps"] == 1
    assert json.loads((copy / SCST_SUMMARY).read_text())["steps"] == 1
    assert (out / ckpt.WEIGHTS).read_bytes() == before

    # without --out: SCST continues in RUN itself, with a named recipe
    args = ["train", "scst", str(out), "--epochs", "1", "--max-steps", "3", "--recipe", "acort", "--device", "cpu"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    stored = json.loads((out / ckpt.CONFIG).read_text())["train"]
    assert stored["scst_optimizer"] == "adam" and stored["batch_size"] == 8  # the run's batch size
    assert json.loads((out / SCST_SUMMARY).read_text())["steps"] == 3


def test_scst_needs_epochs_and_data_is_required_otherwise(tiny_data, tmp_path):
    result = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "x")])
    assert result.exit_code != 0 and "--data" in result.output
    run = tmp_path / "run"
    CliRunner().invoke(main, [*_common(tiny_data, run), "--epochs", "1", "--max-steps", "1"])
    result = CliRunner().invoke(main, ["train", "scst", str(run)])
    assert result.exit_code == 2 and "--epochs" in result.output

    # New-model options before the subcommand (the model, data and recipe are the run's) are refused, not dropped.
    before = sorted(p.name for p in tmp_path.iterdir())
    result = CliRunner().invoke(main, ["train", "--lr", "1e-2", "--model", "x", "scst", str(run), "--epochs", "1"])
    assert result.exit_code == 1 and "--lr" in result.output and "--model" in result.output
    # the old spelling points at the subcommands
    result = CliRunner().invoke(main, ["train", "--init", str(run), "--scst-epochs", "1"])
    assert result.exit_code == 2 and "edgecap train scst RUN" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_bad_recipe_is_refused_before_any_work(tiny_data, tmp_path):
    data, feats = tiny_data
    bad = tmp_path / "bad.json"
    for recipe, said in [
        ("nope", "neither an SCST recipe"),
        ({"scst_lr": 0}, "scst_lr must be a number > 0"),
        ({"scst_samples": 2, "lr": 1}, "unknown key(s) lr"),
    ]:
        if isinstance(recipe, dict):
            bad.write_text(json.dumps(recipe))
            recipe = str(bad)
        for args in (
            [*_common(tiny_data, tmp_path / "new"), "--scst-epochs", "1", "--scst-recipe", recipe],
            ["train", "scst", str(tmp_path), "--out", str(tmp_path / "new"), "--epochs", "1", "--recipe", recipe],
        ):
            result = CliRunner().invoke(main, args)
            assert result.exit_code == 2 and said in result.output, (args, result.output)
            assert not (tmp_path / "new").exists()


def test_scst_stops_on_the_time_limit(tiny_data, tmp_path):
    run = tmp_path / "run"
    assert CliRunner().invoke(main, [*_common(tiny_data, run), "--epochs", "1", "--max-steps", "1"]).exit_code == 0
    copy = tmp_path / "copy"
    args = ["train", "scst", str(run), "--out", str(copy), "--epochs", "50", "--max-minutes", "0.000001",
            "--batch-size", "8", "--device", "cpu"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert json.loads((copy / SCST_SUMMARY).read_text())["steps"] == 1  # stopped after its first step


def _torchrun(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "edgecap", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_two_process_gloo_run_trains_writes_one_checkpoint_and_resumes(tiny_data, tmp_path):
    out = tmp_path / "ddp"
    base = _common(tiny_data, out) + ["--epochs", "2"]
    first = _torchrun([*base, "--scst-epochs", "1", "--scst-max-steps", "1"])
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    config = json.loads((out / ckpt.CONFIG).read_text())
    assert config["model"]["name"] == "acort-test"
    # One writer: one checkpoint directory per stage, one metrics line per logged step (rank 0 only).
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["last", "scst"]
    lines = [json.loads(x) for x in (out / ckpt.METRICS).read_text().splitlines()]
    train_steps = [r["step"] for r in lines if r["event"] == "train"]
    assert len(train_steps) == len(set(train_steps))
    # 32 training images over 2 ranks at 8 images per rank: 2 steps per epoch.
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    scst = json.loads((out / SCST_SUMMARY).read_text())
    assert scst["processes"] == 2 and scst["global_batch_images"] == 16 and scst["steps"] == 1
    # Resume: both ranks load checkpoints/scst and continue to the end of the SCST epoch.
    second = _torchrun([*base, "--scst-epochs", "1"])
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert json.loads((out / SCST_SUMMARY).read_text())["steps"] == 2
    assert json.loads((out / "summary.json").read_text())["steps"] == 4  # the CE stage was complete: not repeated
    assert (out / SCST_STATE / ckpt.STATE).is_file()


def test_train_help_names_every_trainer_and_both_subcommands():
    result = CliRunner().invoke(main, ["train", "--help"], terminal_width=1000)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for trainer in ("cross-entropy", "SCST", "end-to-end", "--teacher", "train scst RUN", "train qat RUN"):
        assert trainer in text, trainer
    commands = text.split("Commands:")[1]
    assert "qat Quantisation-aware" in commands and "scst Self-critical" in commands
    assert "--init" not in text and "--qat-epochs" not in text and "--scst-lr" not in text
