"""``edgecap bench --runs N`` / ``--series``: a speed-up judged over several reports (median, range, runs below a
target), from runs it measures or reports already written."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgecap.bench.config import BenchCfg
from edgecap.bench.ratios import BACKBONE_COMPARISON, RatioSeries
from edgecap.bench.report import write_report
from edgecap.bench.results import BenchReport
from edgecap.bench.series import judged_span, run_series, summarise_series
from edgecap.cli.bench import bench
from tests.bench.conftest import make_report, make_result

ROW = "| onnxruntime vs torch | acort-xsmall | 3 | 1 | onnxruntime fp32 / torch fp32 | 3 | 4.00× (3.00–5.00) |"


def _report(torch_decoder_ms: float) -> BenchReport:
    """torch's decoder loop is ``torch_decoder_ms`` + 1 ms of select; onnxruntime's 3 ms in all."""
    torch = make_result("torch")
    torch = dataclasses.replace(torch, breakdown=dataclasses.replace(torch.breakdown, decoder_ms=torch_decoder_ms))
    onnxruntime = make_result("onnxruntime")
    onnxruntime = dataclasses.replace(onnxruntime, breakdown=dataclasses.replace(onnxruntime.breakdown, decoder_ms=2.0))
    return make_report([torch, onnxruntime])


def _report_dirs(root: Path) -> list[Path]:
    dirs = []
    for i, ms in enumerate((8.0, 11.0, 14.0)):  # decoder loops 9/12/15 ms against 3 ms: 3×, 4×, 5×
        write_report(_report(ms), root / f"run-{i}", plots=False)
        dirs.append(root / f"run-{i}")
    return dirs


def test_series_summarises_existing_reports(tmp_path: Path) -> None:
    runs = _report_dirs(tmp_path)
    out = tmp_path / "summary"
    args = ["--target", "4", "--out", str(out)] + [a for run in runs for a in ("--series", str(run))]
    result = CliRunner().invoke(bench, args)
    assert result.exit_code == 0, result.output
    assert ROW in result.output
    assert "| 1 of 3 (loop) |" in result.output  # only the 3× run is below 4×
    saved = json.loads((out / "series.json").read_text())
    assert saved["target"] == 4 and saved["series"][0]["loop"] == pytest.approx([3.0, 4.0, 5.0])
    assert saved["reports"] == [str(r) for r in runs]
    assert ROW in (out / "series.md").read_text()


def test_runs_measures_back_to_back_and_writes_every_report_and_the_series(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgecap.bench import run as bench_run

    reports = iter([_report(8.0), _report(11.0), _report(14.0)])
    seen: list[BenchCfg] = []

    def fake_run(cfg: BenchCfg, progress: bool = True, *, command: str | None = None) -> BenchReport:
        seen.append(cfg)
        return next(reports)

    monkeypatch.setattr(bench_run, "run_benchmark", fake_run)
    out = tmp_path / "series"
    args = ["--bundle", "b", "--runtime", "torch,onnxruntime", "--runs", "3", "--target", "4.5", "--no-plots"]
    result = CliRunner().invoke(bench, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len(seen) == 3 and len(set(seen)) == 1  # the same configuration every run
    assert sorted(p.name for p in out.iterdir()) == ["run-01", "run-02", "run-03", "series.json", "series.md"]
    assert all((out / f"run-0{i}" / "report.json").is_file() for i in (1, 2, 3))
    assert "| 2 of 3 (loop) |" in (out / "series.md").read_text()
    assert json.loads((out / "series.json").read_text())["reports"] == [str(out / f"run-0{i}") for i in (1, 2, 3)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bundle", "b", "--out", "o", "--target", "3"], "--target judges a series"),
        (["--bundle", "b", "--series", "r"], "do not pass --bundle"),
        (["--series", "r", "--runs", "3"], "--runs measures"),
        (["--series", "r", "--compare", "a", "b"], "exclusive"),
    ],
)
def test_series_options_that_contradict_each_other_are_refused(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(bench, args)
    assert result.exit_code != 0 and message in result.output


def test_a_series_without_any_comparison_fails_naming_what_is_missing(tmp_path: Path) -> None:
    write_report(make_report([make_result("torch")]), tmp_path / "r", plots=False)
    result = CliRunner().invoke(bench, ["--series", str(tmp_path / "r")])
    assert result.exit_code != 0 and "no comparison found" in result.output


def test_run_series_writes_each_run_as_it_finishes(tmp_path: Path) -> None:
    written: list[Path] = []
    logged: list[str] = []
    cfg = BenchCfg(bundles=("b",))
    reports, dirs = run_series(
        cfg,
        2,
        tmp_path,
        measure=lambda c: _report(8.0),
        write=lambda report, run_dir: written.append(run_dir),
        log=logged.append,
    )
    assert dirs == written == [tmp_path / "run-01", tmp_path / "run-02"] and len(reports) == 2
    assert logged[0].startswith(f"run 1/2: {tmp_path / 'run-01'}")
    with pytest.raises(ValueError, match="runs must be >= 1"):
        run_series(cfg, 0, tmp_path, measure=lambda c: _report(8.0), write=lambda r, d: None)
    summary = summarise_series(reports, dirs, target=None)
    assert summary.series[0].loop == pytest.approx((3.0, 3.0)) and "judged" not in summary.lines()[2]


def test_the_backbone_comparison_is_judged_end_to_end_and_the_rest_on_the_decoder_loop() -> None:
    series = RatioSeries("ort vs torch", "m", 3, 1, "ort fp32", "torch fp32", loop=(2.0,), step=(), decode=())
    assert judged_span(series) == "loop"
    assert judged_span(dataclasses.replace(series, comparison=BACKBONE_COMPARISON)) == "end_to_end"
