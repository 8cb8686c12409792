"""Flags that cannot apply are refused up front, with the limits the Python API uses."""

from __future__ import annotations

from click.testing import CliRunner

from edgecap.cli import main
from edgecap.decoding.config import MAX_BEAM


def test_caption_beam_is_capped_at_max_beam(tmp_path):
    result = CliRunner().invoke(main, ["caption", str(tmp_path / "a.png"), "--beam", str(MAX_BEAM + 1)])
    assert result.exit_code == 2 and f"1<=x<={MAX_BEAM}" in result.output
    assert f"at most {MAX_BEAM}" in CliRunner().invoke(main, ["caption", "--help"]).output
