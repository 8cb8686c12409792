"""Absurd numbers are usage errors when the command line is parsed (exit 2, one line), before a command allocates,
starts threads or loops for hours on a typo."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from edgecap.cli import main

HUGE = "1000000000"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["features", "--data", "{tmp}", "--workers", "100000"], "--workers"),
        (["features", "--data", "{tmp}", "--size", "1000000"], "--size"),
        (["data", "synth", "--out", "{tmp}/d", "--images", HUGE], "--images"),
        (["data", "synth", "--out", "{tmp}/d", "--images", "-3"], "--images"),
        (["data", "synth", "--out", "{tmp}/d", "--size", "100000"], "--size"),
        (["engine", "{tmp}", "--max-batch", HUGE], "--max-batch"),
        (["quickstart", "--images", HUGE], "--images"),
        (["caption", "x.jpg", "--beam", "0"], "--beam"),
    ],
)
def test_absurd_numbers_are_usage_errors(tmp_path: Path, args: list[str], flag: str) -> None:
    result = CliRunner().invoke(main, [a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2, result.output
    assert flag in result.output and "Traceback" not in result.output
    assert not (tmp_path / "d").exists()
