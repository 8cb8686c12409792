"""``benchmarks/family_compare.py``: every model gets the same training seconds and the ablation its override; the
whole pipeline runs on CPU at a tiny size (the GPU run is the same script at the quickstart's size)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scripts import load_script


def _load_script():  # type: ignore[no-untyped-def]
    return load_script("family_compare")


def test_equal_seconds_for_every_model_and_the_relations_ablation(tmp_path: Path) -> None:
    script = _load_script()
    args = script.parse_args(["--device", "cuda", "--seconds", "90", "--out", str(tmp_path)])
    cmds = {name: list(map(str, script.train_cmd(args, model, sets, tmp_path / "d", tmp_path / "f", tmp_path / name)))
            for name, model, sets in script.DEFAULT_RUNS}  # fmt: skip
    assert {c[c.index("--max-minutes") + 1] for c in cmds.values()} == {"1.5000"}
    assert {c[c.index("--epochs") + 1] for c in cmds.values()} == {"12"}
    ablation = cmds["image-transformer-xsmall, relations off"]
    assert ablation[ablation.index("--set") + 1] == "relations=false"
    assert "--set" not in cmds["image-transformer-xsmall"]


@pytest.mark.slow
def test_smoke_run_writes_a_table_for_every_model(tmp_path: Path) -> None:
    script = _load_script()
    code = script.main(["--smoke", "--out", str(tmp_path / "out"), "--budget", "600"])
    report = json.loads((tmp_path / "out" / "family_compare.json").read_text())
    assert code == 0, report["stages"]
    assert [r["run"] for r in report["rows"]] == [r[0] for r in script.DEFAULT_RUNS]
    assert all(r["test_cider_d"] is not None for r in report["rows"])
    assert (tmp_path / "out" / "family_compare.md").read_text().count("| image-transformer-xsmall") == 2
