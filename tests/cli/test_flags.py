"""Flags that cannot apply are refused up front, with the limits the Python API uses."""

from __future__ import annotations

from click.testing import CliRunner

from edgecap.cli import main
from edgecap.runtime.decoding.config import MAX_BEAM


def test_caption_beam_is_capped_at_max_beam(tmp_path):
    result = CliRunner().invoke(main, ["caption", str(tmp_path / "a.png"), "--beam", str(MAX_BEAM + 1)])
    assert result.exit_code == 2 and f"1<=x<={MAX_BEAM}" in result.output
    assert f"at most {MAX_BEAM}" in CliRunner().invoke(main, ["caption", "--help"]).output


def test_caption_checks_image_paths_before_loading_a_model(tmp_path, monkeypatch):
    from edgecap.runtime import captioner

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the image paths were checked")

    monkeypatch.setattr(captioner.Captioner, "load", no_loading)
    monkeypatch.setattr(captioner.Captioner, "from_run", no_loading)
    missing = tmp_path / "missing.jpg"
    result = CliRunner().invoke(main, ["caption", str(missing), "--model", str(tmp_path / "bundle")])
    assert result.exit_code == 1 and f"no such image file (1 of 1): {missing}" in result.output
