"""``tools.stages``, the time-boxed stages of the training studies in ``research/``: a stage over its limit
is stopped with everything it started (torchrun's workers), and the results JSON is on disk after every change."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tools import stages


def test_a_timed_out_stage_stops_its_children_too(tmp_path: Path) -> None:
    marker = tmp_path / "child-survived"
    child = f"import time, pathlib; time.sleep(8); pathlib.Path({str(marker)!r}).write_text('x')"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    record = stages.run_stage("sleepy", [sys.executable, "-c", parent], 5, tmp_path / "logs")
    assert record["status"] == "timed out after 5 s" and record["wall_s"] < 8
    time.sleep(4)
    assert not marker.exists()
    assert stages.run_stage("skipped", [sys.executable, "-c", "pass"], 1, tmp_path)["status"].startswith("skipped")


def test_results_are_written_after_every_change(tmp_path: Path) -> None:
    results = stages.Results(tmp_path / "r.json", {"model": "m"})
    results.stage({"stage": "a", "status": "ok"})
    results.row({"x": 1})
    assert json.loads((tmp_path / "r.json").read_text()) == {
        "meta": {"model": "m"}, "stages": [{"stage": "a", "status": "ok"}], "rows": [{"x": 1}]
    }  # fmt: skip
    assert stages.md_table([{"a": 1}, {"b": None}], ["a", "b"]).splitlines()[2:] == ["| 1 |  |", "|  |  |"]
