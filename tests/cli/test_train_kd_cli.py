"""``edgecap train --teacher RUN``: distillation from the command line."""

from __future__ import annotations

import json

from click.testing import CliRunner

from edgecap.cli import main
from edgecap.workshop.training import checkpoint as ckpt


def test_distil_from_the_command_line(tiny_data, tiny_parent_run, tmp_path):
    data, feats = tiny_data
    out = tmp_path / "student"
    args = ["train", "--model", "acort-test", "--data", str(data), "--features", str(feats), "--out", str(out),
            "--set", "radix_base=64", "--batch-size", "8", "--max-steps", "2", "--device", "cpu",
            "--teacher", str(tiny_parent_run), "--kd-mode", "both", "--kd-temperature", "3",
            "--kd-beam", "1"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    step = json.loads((out / ckpt.CONFIG).read_text())["compression"][0]
    assert step["mode"] == "both" and step["temperature"] == 3.0 and step["beam"] == 1


def test_teacher_is_not_an_init_option(tiny_parent_run, tmp_path):
    args = ["train", "--init", str(tiny_parent_run), "--out", str(tmp_path / "x"), "--scst-epochs", "1",
            "--teacher", str(tiny_parent_run)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and "--teacher" in result.output
