"""``benchmarks/scst_compare.py`` on CPU at a tiny size: every stage (synthetic data, features, cross-entropy, SCST,
equal-time cross-entropy, evaluation) runs and the JSON and markdown report are written; the GPU run is the same
script at the quickstart's size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scripts import load_script


def _load_script():  # type: ignore[no-untyped-def]
    return load_script("scst_compare")


def test_plan_uses_the_quickstart_recipe_and_scst_from_a_copy(tmp_path: Path) -> None:
    script = _load_script()
    args = script.parse_args(["--model", "acort-xsmall", "--device", "cuda", "--out", str(tmp_path)])
    paths = script.plan(args)
    ce = list(map(str, paths["ce_cmd"]))
    assert ce[ce.index("--epochs") + 1] == "12" and ce[ce.index("--device") + 1] == "cuda"
    assert "synthetic-2000" in str(paths["data"])
    scst = list(map(str, paths["scst_cmd"]))
    assert scst[scst.index("--init") + 1] == str(paths["base"]) and scst[scst.index("--out") + 1] == str(paths["scst"])
    more = list(map(str, script.ce_more_cmd(args, paths, 90.0)))
    assert more[more.index("--max-minutes") + 1] == "1.5000" and more[more.index("--out") + 1] == str(paths["ce_more"])


def test_a_killed_scst_run_is_timed_from_its_last_logged_line(tmp_path: Path) -> None:
    script = _load_script()
    assert script.scst_seconds(tmp_path) is None
    lines = [{"event": "scst_val", "epoch": -1, "elapsed_s": 1.5}, {"event": "scst", "step": 20, "elapsed_s": 9.25}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + '\n{"cut')
    assert script.scst_seconds(tmp_path) == 9.25


@pytest.mark.slow  # six processes that each import torch: ~35 s on 2 idle cores, more on a busy CI machine
@pytest.mark.parametrize("model", ["expansionnet-v2-xsmall"])
def test_smoke_runs_every_stage_and_writes_the_table(tmp_path: Path, model: str) -> None:
    script = _load_script()
    out = tmp_path / "out"
    assert script.main(["--smoke", "--model", model, "--out", str(out)]) == 0
    report = json.loads((out / "scst_compare.json").read_text())
    assert [s["status"] for s in report["stages"]] == ["ok"] * 6
    assert [s["stage"] for s in report["stages"]] == ["data", "features", "ce", "scst", "ce_more", "eval"]
    rows = report["rows"]
    assert len(rows) == 3 and all(isinstance(r["test_cider_d"], float) for r in rows)
    assert rows[1]["steps"] == 6 and rows[2]["steps"] > 0 and rows[1]["train_s"] > 0
    assert "not pycocoevalcap" in report["meta"]["cider"]
    table = (out / "scst_compare.md").read_text()
    assert "| model | stage | train_s |" in table and "SCST" in table
