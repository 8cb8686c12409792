"""Smoke tests of ``edgecap data synth`` and ``edgecap data stats`` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from edgecap.cli.data import data


def test_synth_then_stats(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "synth"
    args = ["synth", "--out", str(out), "--images", "10", "--seed", "3", "--no-progress"]
    result = runner.invoke(data, args)
    assert result.exit_code == 0, result.output
    document = json.loads((out / "dataset.json").read_text())
    assert len(document["images"]) == 10 and document["generator"]["seed"] == 3

    result = runner.invoke(data, ["stats", str(out)])
    assert result.exit_code == 0, result.output
    assert "images: 10 (train 8, val 1, test 1)" in result.output
    assert "20-25 words" in result.output

    result = runner.invoke(data, ["stats", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["captions"] == 50


def test_synth_refuses_non_empty_directory_without_overwrite(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "synth"
    base = ["synth", "--out", str(out), "--images", "2", "--no-progress"]
    assert runner.invoke(data, base).exit_code == 0
    result = runner.invoke(data, base)
    assert result.exit_code == 1 and "not empty" in result.output and "--overwrite" in result.output
    assert runner.invoke(data, [*base, "--overwrite", "--compositional"]).exit_code == 0
    assert json.loads((out / "dataset.json").read_text())["generator"]["compositional"] is True


def test_synth_rejects_bad_splits(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(data, ["synth", "--out", str(tmp_path / "x"), "--splits", "0.5,0.5", "--no-progress"])
    assert result.exit_code == 2 and "three" in result.output
    result = runner.invoke(data, ["synth", "--out", str(tmp_path / "x"), "--splits", "0.5,0.5,0.5", "--no-progress"])
    assert result.exit_code == 1 and "sum to 1" in result.output
    assert not (tmp_path / "x").exists()


def test_stats_reports_missing_dataset(tmp_path: Path) -> None:
    result = CliRunner().invoke(data, ["stats", str(tmp_path)])
    assert result.exit_code == 1 and "dataset.json" in result.output
