"""``benchmarks/ratio_series.py``: the summary of existing reports, and the one bench option it must own."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from edgecap.bench.report import write_report
from tests.bench.conftest import make_report, make_result


def _load_script():  # type: ignore[no-untyped-def]
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "ratio_series.py"
    spec = importlib.util.spec_from_file_location("ratio_series_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report_dir(root: Path, name: str, torch_decoder_ms: float) -> Path:
    torch = make_result("torch")
    torch = dataclasses.replace(torch, breakdown=dataclasses.replace(torch.breakdown, decoder_ms=torch_decoder_ms))
    ort = make_result("onnxruntime")
    ort = dataclasses.replace(ort, breakdown=dataclasses.replace(ort.breakdown, decoder_ms=2.0))
    write_report(make_report([torch, ort]), root / name, plots=False)
    return root / name


def test_summarises_existing_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    script = _load_script()
    runs = [_report_dir(tmp_path, f"run-{i}", ms) for i, ms in enumerate((8.0, 11.0, 14.0))]  # loops 9/12/15 vs 3 ms
    out = tmp_path / "summary"
    monkeypatch.setattr(
        sys, "argv", ["ratio_series.py", "--target", "4", "--out", str(out), "--reports", *map(str, runs)]
    )
    script.main()
    printed = capsys.readouterr().out
    row = "| onnxruntime vs torch | acort-xsmall | 3 | 1 | onnxruntime fp32 / torch fp32 | 3 | 4.00× (3.00–5.00) |"
    assert row in printed
    assert printed.rstrip().endswith("| 1 of 3 |")
    saved = json.loads((out / "series.json").read_text())
    assert saved["target"] == 4 and saved["series"][0]["loop"] == pytest.approx([3.0, 4.0, 5.0])
    assert (out / "series.md").read_text().strip() == printed.strip()


def test_refuses_an_out_option_meant_for_each_run(tmp_path: Path) -> None:
    script = _load_script()
    with pytest.raises(SystemExit, match="give --out to this script"):
        script.run_series(2, tmp_path, ["--bundle", "b", "--out", "x"])
    assert not list(tmp_path.iterdir())  # nothing ran
