"""``edgecap train qat RUN --out NEW --epochs N``: the command line of quantisation-aware training."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgecap.cli import main
from edgecap.workshop.training import checkpoint as ckpt


def test_qat_from_the_command_line(tiny_parent_run, tmp_path):
    out = tmp_path / "qat"
    args = ["train", "qat", str(tiny_parent_run), "--out", str(out), "--epochs", "1", "--max-steps", "2",
            "--target", "tensorrt", "--batch-size", "8", "--device", "cpu"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "--target tensorrt" in result.output
    step = json.loads((out / ckpt.CONFIG).read_text())["compression"][-1]
    assert step["kind"] == "qat" and step["steps"] == 2 and step["target"] == "tensorrt"

    again = CliRunner().invoke(main, args)  # the run exists: refused before any work
    assert again.exit_code != 0 and "exists" in again.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "Missing option '--out'"),
        (["--out", "X", "--target", "gpu"], "gpu"),
        (["--out", "X", "--lr", "nan"], "not a finite number"),
    ],
)
def test_bad_qat_requests_are_refused(tiny_parent_run, tmp_path, extra, message):
    extra = [str(tmp_path / "x") if e == "X" else e for e in extra]
    result = CliRunner().invoke(main, ["train", "qat", str(tiny_parent_run), "--epochs", "1", *extra])
    assert result.exit_code != 0 and message in result.output, result.output
    assert not (tmp_path / "x").exists()


def test_qat_needs_a_trained_run(tmp_path):
    result = CliRunner().invoke(main, ["train", "qat", str(tmp_path / "none"), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "no trained run found" in result.output
    result = CliRunner().invoke(main, ["train", "--data", str(tmp_path), "--qat-epochs", "1"])  # the old spelling
    assert result.exit_code == 2 and "edgecap train qat RUN" in result.output
