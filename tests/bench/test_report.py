"""``BenchReport``: JSON round trip and validation, the documented schema, derived columns, markdown and plots."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest

from edgecap.bench.harness import LatencyStats
from edgecap.bench.markdown import format_markdown
from edgecap.bench.memory import PowerStats
from edgecap.bench.plots import pareto_front
from edgecap.bench.report import (
    SCHEMA_VERSION,
    BenchReport,
    BundleInfo,
    ComboResult,
    ReportError,
    Skip,
    load_report,
    write_report,
)
from edgecap.bench.run import link_results

from .conftest import make_report, make_result


def _report() -> BenchReport:
    results = [
        make_result("torch-rerun", times_ms=(40.0, 44.0, 42.0, 46.0), quality=1.10),
        make_result("torch", times_ms=(10.0, 12.0, 11.0, 30.0), quality=1.10),
        make_result("onnxruntime", times_ms=(5.0, 6.0, 7.0, 8.0), quality=1.00),
        make_result("onnxruntime", "int8", times_ms=(2.0, 3.0, 4.0, 5.0), quality=0.99),
        make_result("torch", batch=8, times_ms=(40.0, 40.0, 44.0, 44.0)),
        make_result("torch-rerun", batch=8, times_ms=(400.0, 400.0, 440.0, 440.0)),
    ]
    return make_report(link_results(results))


# -- JSON ------------------------------------------------------------------------------------------------------------
def test_round_trip_is_exact(tmp_path: Path) -> None:
    report = _report()
    report = dataclasses.replace(
        report,
        skipped=[Skip("/b", "torch", "int8", "torch runs fp32/fp16")],
        errors=[Skip("/b", "onnxruntime", "fp16", "RuntimeError: boom", beam=3, batch=32)],
    )
    first = report.results[0]
    power = PowerStats(samples=3, total_mean_mw=4000.0, total_peak_mw=4500.0, rails_mean_mw={"VDD_IN": 4000.0})
    report.results[0] = dataclasses.replace(first, power=power)
    written = write_report(report, tmp_path, plots=False)
    text = written["json"].read_text()
    assert "NaN" not in text and "Infinity" not in text
    loaded = load_report(tmp_path)
    assert loaded == report
    assert isinstance(loaded.results[0].latency.p50_ci95_ms, (tuple, type(None)))


def test_nan_is_written_as_null(tmp_path: Path) -> None:
    result = dataclasses.replace(
        make_result(), breakdown=dataclasses.replace(make_result().breakdown, ttft_ms=float("nan"))
    )
    write_report(make_report([result]), tmp_path, plots=False)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["results"][0]["breakdown"]["ttft_ms"] is None
    assert load_report(tmp_path / "report.json").results[0].breakdown.ttft_ms is None


def test_schema_version_and_required_keys(tmp_path: Path) -> None:
    data = _report().to_dict()
    assert data["schema_version"] == SCHEMA_VERSION
    assert set(data) == {f.name for f in dataclasses.fields(BenchReport)}
    result = data["results"][0]
    for key in ("latency", "throughput", "breakdown", "memory", "size", "quality", "speedup_vs_rerun", "loop"):
        assert key in result
    for key in ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "stdev_ms", "rel_stdev_pct"):
        assert key in result["latency"]
    for key in ("images_per_s", "captions_per_s", "tokens_per_s"):
        assert key in result["throughput"]
    for key in ("encoder_ms", "decoder_step_ms", "steps", "ttft_ms"):
        assert key in result["breakdown"]
    for key in ("rss_peak_bytes", "rss_peak_scope", "gpu_allocated_peak_bytes", "unified_used_peak_bytes"):
        assert key in result["memory"]
    json.dumps(data, allow_nan=False)


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    return path


def test_load_report_names_the_missing_field(tmp_path: Path) -> None:
    data = _report().to_dict()
    del data["results"][1]["latency"]["p90_ms"]
    with pytest.raises(ReportError, match=r"report\.json: \$\.results\[1\]\.latency: field 'p90_ms' is missing"):
        load_report(_write(tmp_path, data))


def test_load_report_names_a_mistyped_field(tmp_path: Path) -> None:
    data = _report().to_dict()
    data["results"][0]["batch"] = "one"
    with pytest.raises(ReportError, match=r"report\.json: \$\.results\[0\]\.batch: expected integer, got string"):
        load_report(_write(tmp_path, data))


def test_load_report_refuses_newer_schema(tmp_path: Path) -> None:
    data = _report().to_dict()
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ReportError, match="newer"):
        load_report(_write(tmp_path, data))


def test_load_report_ignores_unknown_fields(tmp_path: Path) -> None:
    data = _report().to_dict()
    data["future_field"] = 1
    data["results"][0]["latency"]["p999_ms"] = 3.0
    assert load_report(_write(tmp_path, data)) == _report()


def test_load_report_rejects_non_reports(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ReportError, match="not a JSON"):
        load_report(tmp_path / "bad.json")
    with pytest.raises(ReportError, match="schema_version"):
        load_report(_write(tmp_path, {"results": []}))
    with pytest.raises(FileNotFoundError):
        load_report(tmp_path / "absent.json")


# -- derived columns -------------------------------------------------------------------------------------------------
def test_speedup_vs_rerun() -> None:
    by = {(r.runtime, r.precision, r.batch): r for r in _report().results}
    rerun_p50 = LatencyStats.from_seconds([0.040, 0.044, 0.042, 0.046]).p50_ms  # 43
    assert by["torch", "fp32", 1].speedup_vs_rerun == pytest.approx(rerun_p50 / 11.5)
    assert by["torch-rerun", "fp32", 1].speedup_vs_rerun == pytest.approx(1.0)
    assert by["onnxruntime", "fp32", 1].speedup_vs_rerun == pytest.approx(rerun_p50 / 6.5)
    int8 = by["onnxruntime", "int8", 1]
    assert int8.speedup_vs_rerun == pytest.approx(rerun_p50 / 3.5)
    assert int8.speedup_reference == "torch-rerun fp32"  # INT8 has no re-run: compared with the FP32 baseline
    assert by["torch", "fp32", 8].speedup_vs_rerun == pytest.approx(10.0)  # batch matched with batch


def test_no_speedup_without_baseline() -> None:
    linked = link_results([make_result("onnxruntime")])
    assert linked[0].speedup_vs_rerun is None and linked[0].speedup_reference is None


def test_quality_delta_to_fp32() -> None:
    by = {(r.runtime, r.precision, r.batch): r for r in _report().results}
    int8 = by["onnxruntime", "int8", 1].quality
    assert int8 is not None
    assert int8.delta_to_fp32 == pytest.approx(-0.01) and int8.ratio_to_fp32 == pytest.approx(0.99)
    assert int8.reference == "onnxruntime fp32"  # same runtime's FP32 first
    onnxruntime = by["onnxruntime", "fp32", 1].quality
    assert onnxruntime is not None and onnxruntime.delta_to_fp32 == pytest.approx(0.0)
    lone = link_results([make_result("onnxruntime", "int8", quality=0.5), make_result("torch", quality=1.0)])
    assert lone[0].quality is not None and lone[0].quality.reference == "torch fp32"  # fallback: another runtime
    assert lone[0].quality.ratio_to_fp32 == pytest.approx(0.5)


# -- markdown and plots ----------------------------------------------------------------------------------------------
def test_markdown_tables() -> None:
    text = format_markdown(_report())
    assert "## Single-stream latency" in text and "## Offline throughput" in text
    assert "## Where the time goes" in text and "## Memory, size and power" in text and "## Quality" in text
    assert "speed-up vs re-run prefix" in text
    assert "3.74×" in text  # 43 / 11.5
    assert "12.29× (vs fp32)" in text  # INT8 against the FP32 re-run
    assert "p99 is interpolated" in text  # 4 samples < 100
    assert "| acort-xsmall | onnxruntime | int8 | 3 | 99.0 | -1.0 | 99.0 % | onnxruntime fp32 |" in text
    assert "Command: `edgecap bench" in text and "## Environment" in text and "Test CPU" in text
    header = next(line for line in text.splitlines() if line.startswith("| model | runtime | precision | beam | p50"))
    rows = [line for line in text.splitlines() if line.startswith("| acort-xsmall | torch | fp32 | 3 | 11.5")]
    assert rows and rows[0].count("|") == header.count("|")


def test_markdown_lists_skips_and_errors() -> None:
    report = dataclasses.replace(
        make_report([]),
        skipped=[Skip("/b/acort", "torch", "int8", "torch runs fp32/fp16 weights")],
        errors=[Skip("/b/acort", "onnxruntime", "fp32", "MemoryError: out", beam=3, batch=32)],
    )
    text = format_markdown(report)
    assert "- torch int8 on acort: torch runs fp32/fp16 weights" in text
    assert "- onnxruntime fp32 beam 3 batch 32 on acort: MemoryError: out" in text


def test_a_provider_fallback_is_kept_in_the_json_and_named_above_the_tables(tmp_path: Path) -> None:
    """Rows measured on the CPU because the GPU providers did not start say so, in report.json and report.md."""
    fallback = {
        "requested": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
        "in_use": ["CPUExecutionProvider"],
        "cause": "TensorRT: TensorRT is not installed: libnvinfer.so.10",
    }
    fell_back = dataclasses.replace(make_result("onnxruntime"), provider_fallback=fallback)
    report = make_report([fell_back, make_result("torch")])
    write_report(report, tmp_path, plots=False)
    assert load_report(tmp_path).results[0].provider_fallback == fallback
    text = format_markdown(report)
    assert "## Execution providers that did not start" in text
    assert "ran on CPUExecutionProvider, not TensorrtExecutionProvider" in text and "libnvinfer.so.10" in text
    assert "did not start" not in format_markdown(_report())


def test_write_report_with_plots(tmp_path: Path) -> None:
    written = write_report(_report(), tmp_path / "out")
    assert set(written) == {"json", "markdown", "latency_vs_batch", "pareto"}
    for name in ("latency_vs_batch", "pareto"):
        assert written[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list((tmp_path / "out").glob(".*tmp"))  # atomic writes leave no temporaries


def test_no_pareto_without_quality(tmp_path: Path) -> None:
    messages: list[str] = []
    written = write_report(make_report([make_result()]), tmp_path, log=messages.append)
    assert "pareto" not in written and "latency_vs_batch" in written
    assert any("pareto" in m for m in messages)


def test_pareto_front() -> None:
    # (latency, quality): 0 fastest, 2 best; 1 is dominated by 0 (slower and worse); 3 ties 2's quality but slower.
    points = [(1.0, 0.8), (2.0, 0.7), (3.0, 1.0), (4.0, 1.0), (0.5, 0.1)]
    assert pareto_front(points) == [4, 0, 2]


def test_report_field_types_resolve() -> None:
    for cls in (BenchReport, ComboResult, BundleInfo):
        typing.get_type_hints(cls)  # every annotation resolves (load_report relies on it)


def test_a_report_from_before_the_runtime_rename_reads_with_the_current_name(tmp_path: Path) -> None:
    """Reports written when ONNX Runtime's runtime was called ``ort`` compare with new ones."""
    data = make_report([make_result("onnxruntime"), make_result("torch")]).to_dict()
    for result in data["results"]:
        result["runtime"] = {"onnxruntime": "ort"}.get(result["runtime"], result["runtime"])
    data["config"]["runtimes"] = ["torch", "ort"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    report = load_report(path)
    assert [r.runtime for r in report.results] == ["onnxruntime", "torch"]
    assert report.config["runtimes"] == ["torch", "onnxruntime"]


def test_the_onnxruntime_threads_column_shows_the_wide_session() -> None:
    from edgecap.bench.markdown import _onnxruntime_threads
    from edgecap.runtime.backends.threads import plan_threads

    result = make_result(runtime="onnxruntime")
    per_call = dataclasses.replace(result, threads=plan_threads("auto", cores=2).as_dict())
    explicit = dataclasses.replace(result, threads=plan_threads(1).as_dict())
    assert _onnxruntime_threads(explicit) == "1, no spin"
    rows = " / ".join(f"{role} {n}" for role, n in sorted(per_call.threads["wide"]["from_rows"].items()))
    assert _onnxruntime_threads(per_call) == f"1, no spin; batches in 2 chunks; 2 from {rows} rows"
    legacy = dataclasses.replace(result, threads={k: v for k, v in per_call.threads.items() if k != "decode_workers"})
    assert _onnxruntime_threads(legacy) == f"1, no spin; 2 from {rows} rows"  # a report from before split decodes
    assert BenchReport.from_dict(json.loads(json.dumps(make_report([per_call]).to_dict()))).results[0].threads == (
        per_call.threads
    )
