"""``edgecap prune``: argument errors are one line, before any work; a run is derived and recorded."""

from __future__ import annotations

import json

from click.testing import CliRunner

from edgecap.cli import main


def _prune(*args: str):
    return CliRunner().invoke(main, ["prune", *args])


def _params(run) -> int:
    return json.loads((run / "config.json").read_text())["model"]["parameters"]


def test_refuses_an_existing_out(tiny_parent_run, tmp_path):
    (tmp_path / "taken").mkdir()
    result = _prune(str(tiny_parent_run), "--out", str(tmp_path / "taken"), "--sparsity", "2:4")
    assert result.exit_code != 0 and "already exists" in result.output


def test_refuses_a_target_at_or_above_the_model(tiny_parent_run, tmp_path):
    result = _prune(
        str(tiny_parent_run), "--out", str(tmp_path / "o"), "--target-params", str(_params(tiny_parent_run) + 1)
    )
    assert result.exit_code != 0 and "nothing to prune" in result.output
    assert not (tmp_path / "o").exists()


def test_refuses_an_impossible_target(tiny_parent_run, tmp_path):
    result = _prune(str(tiny_parent_run), "--out", str(tmp_path / "o"), "--target-params", "100")
    assert result.exit_code != 0 and "out of reach" in result.output
    assert not (tmp_path / "o").exists()


def test_refuses_a_bad_pattern_and_needs_exactly_one_mode(tiny_parent_run, tmp_path):
    result = _prune(str(tiny_parent_run), "--out", str(tmp_path / "o"), "--sparsity", "1:2")
    assert result.exit_code != 0 and "not supported" in result.output
    result = _prune(str(tiny_parent_run), "--out", str(tmp_path / "o"))
    assert result.exit_code != 0 and "exactly one" in result.output
    result = _prune(str(tiny_parent_run), "--out", str(tmp_path / "o"), "--sparsity", "2:4", "--target-params", "5")
    assert result.exit_code != 0 and "exactly one" in result.output


def test_prunes_a_run(tiny_parent_run, tmp_path):
    target = _params(tiny_parent_run) - 2000
    out = tmp_path / "pruned"
    result = _prune(str(tiny_parent_run), "--out", str(out), "--target-params", str(target), "--max-steps", "1")
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["parameters"] <= target and config["compression"][-1]["kind"] == "pruning"


def test_refuses_an_out_inside_the_run(tiny_parent_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_parent_run, run)
    result = _prune(str(run), "--out", str(run / "pruned"), "--sparsity", "2:4")
    assert result.exit_code == 1 and "lies inside RUN" in result.output
    assert not (run / "pruned").exists()


def test_refuses_a_learning_rate_that_is_not_finite(tiny_parent_run, tmp_path):
    for lr in ("nan", "inf"):
        result = _prune(str(tiny_parent_run), "--out", str(tmp_path / "o"), "--target-params", "100000", "--lr", lr)
        assert result.exit_code == 2 and "not a finite number" in result.output
        assert "Traceback" not in result.output and not (tmp_path / "o").exists()
