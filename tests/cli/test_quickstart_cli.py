"""The README's main job, end to end at a toy size: every stage runs and leaves what the next one needs."""

import json

from click.testing import CliRunner

from edgecap.cli import main
from edgecap.runtime.bundle import load_bundle


def test_quickstart_runs_every_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGECAP_HOME", str(tmp_path))
    result = CliRunner().invoke(
        main, ["quickstart", "--images", "50", "--epochs", "1", "--threads", "1", "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "runs" / "acort-xsmall" / "quickstart.json").read_text())
    assert summary["metrics"]["CIDEr-D"] is not None
    assert {row["precision"] for row in summary["bundle"]["variants"]} >= {"fp32", "fp16", "int8"}
    bundle = load_bundle(tmp_path / "bundles" / "acort-xsmall", graphs="none")
    assert bundle.backbone_in_graph and bundle.decode_inputs == ("pixel_values",)  # pixels in, every precision
    assert all(s["precision"] for s in summary["bundle"]["samples"])  # captioned through the bundle
    report = json.loads((tmp_path / "bundles" / "acort-xsmall-bench" / "report.json").read_text())
    assert {r["runtime"] for r in report["results"]} >= {"torch", "onnxruntime"}
    # A second run reuses the dataset, features, run and bundle instead of redoing them.
    again = CliRunner().invoke(
        main, ["quickstart", "--images", "50", "--epochs", "1", "--threads", "1", "--device", "cpu"]
    )
    assert again.exit_code == 0, again.output
    assert "reusing" in again.output
