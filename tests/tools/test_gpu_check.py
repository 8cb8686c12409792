"""``tools.gpu_check`` without a GPU: the orchestration (sections in their own processes, budgets, JSON and
summary written as they go) runs as its CPU smoke test; the CUDA numbers themselves come from a GPU run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import gpu_check


def test_sections_write_json_and_a_summary_as_they_go(tmp_path: Path, monkeypatch) -> None:
    sections = (("transfer", 120), ("onnxruntime", 120))  # a shared CI CPU starts torch slowly
    monkeypatch.setattr(gpu_check, "SECTIONS", sections)
    out = tmp_path / "out"
    args = ["--device", "cpu", "--out", str(out), "--only", "transfer,onnxruntime", "--budget", "300"]
    assert gpu_check.main(args) == 0
    env = json.loads((out / "env.json").read_text())
    assert {"torch", "onnxruntime", "runtimes", "cuda_available"} <= set(env)
    onnxruntime = json.loads((out / "onnxruntime.json").read_text())
    status = {row["provider"]: row["status"] for row in onnxruntime["rows"] if row["runtime"] == "onnxruntime"}
    if "CUDAExecutionProvider" not in (env.get("onnxruntime_providers") or []):
        assert status["CUDAExecutionProvider"].startswith("not available")
    assert "finished" in onnxruntime
    summary = (out / "summary.md").read_text()
    assert "## transfer — ok" in summary and "## onnxruntime — ok" in summary and "random-weights" in summary


def test_without_cuda_the_gpu_run_refuses_and_says_how_to_smoke_test(tmp_path: Path, capsys) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert gpu_check.main(["--out", str(tmp_path), "--only", "tests"]) == 1
    assert "--device cpu" in capsys.readouterr().out


def test_markdown_table_keeps_every_key_in_first_seen_order() -> None:
    table = gpu_check.markdown_table([{"a": 1, "b": 2}, {"a": 3, "c": 4, "nested": {"x": 1}}])
    assert table.splitlines()[0] == "| a | b | c |"
    assert table.splitlines()[3] == "| 3 |  | 4 |"
