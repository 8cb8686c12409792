"""``edgecap train --init RUN --qat-epochs N --out NEW``: the command line of quantisation-aware training."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgecap.cli import main
from edgecap.workshop.training import checkpoint as ckpt


def test_qat_from_the_command_line(tiny_parent_run, tmp_path):
    out = tmp_path / "qat"
    args = ["train", "--init", str(tiny_parent_run), "--out", str(out), "--qat-epochs", "1", "--qat-max-steps", "2",
            "--qat-target", "tensorrt", "--batch-size", "8", "--device", "cpu"]  # fmt: skip
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
        ([], "--out NEW_RUN"),
        (["--out", "X", "--scst-epochs", "1"], "QAT last"),
        (["--out", "X", "--qat-target", "gpu"], "gpu"),
    ],
)
def test_bad_qat_requests_are_refused(tiny_parent_run, tmp_path, extra, message):
    extra = [str(tmp_path / "x") if e == "X" else e for e in extra]
    result = CliRunner().invoke(main, ["train", "--init", str(tiny_parent_run), "--qat-epochs", "1", *extra])
    assert result.exit_code != 0 and message in result.output, result.output
    assert not (tmp_path / "x").exists()


def test_qat_needs_a_trained_run(tmp_path):
    result = CliRunner().invoke(main, ["train", "--data", str(tmp_path), "--qat-epochs", "1"])
    assert result.exit_code != 0 and "--init RUN" in result.output
