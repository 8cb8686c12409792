"""``edgecap bench`` end to end on a tiny real bundle (torch, torch-rerun, ONNX Runtime), the isolated worker path,
``--compare``, and the errors a user can make. Nothing here checks absolute speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from edgecap.bench.report import load_report, write_report
from edgecap.bench.run import BenchCfg, BenchCfgError, run_benchmark
from edgecap.cli.bench import bench

from .conftest import make_report, make_result

FAST = ["--warmup", "1", "--min-repeats", "2", "--min-seconds", "0", "--threads", "1", "--quiet"]


def test_cli_smoke(tiny_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = [
        "--bundle",
        str(tiny_bundle),
        "--runtime",
        "torch,torch-rerun",
        "--runtime",
        "onnxruntime",
        "--precision",
        "fp32,fp16",
        "--batch",
        "1,2",
        "--beam",
        "1,2",
        "--synthetic",
        "3",
        "--no-isolate",
        "--out",
        str(out),
        *FAST,
        "--spin",
    ]
    result = CliRunner().invoke(bench, args)
    assert result.exit_code == 0, result.output
    assert "12 combination(s) measured, 3 skipped, 0 failed" in result.output

    report = load_report(out / "report.json")
    assert report.schema_version == 1 and not report.errors
    assert {(s.runtime, s.precision) for s in report.skipped} == {
        ("torch", "fp16"),
        ("torch-rerun", "fp16"),
        ("onnxruntime", "fp16"),
    }
    assert all("no fp16 variant" in s.reason for s in report.skipped)
    combos = {(r.runtime, r.beam, r.batch) for r in report.results}
    assert combos == {
        (rt, beam, batch) for rt in ("torch", "torch-rerun", "onnxruntime") for beam in (1, 2) for batch in (1, 2)
    }
    for r in report.results:
        assert r.latency.count >= 2 and r.loop.warmup == 1 and len(r.loop.warmup_ms) == 1
        assert r.scenario == ("single-stream" if r.batch == 1 else "offline")
        assert r.input == "features" and r.backbone is None
        assert r.breakdown.steps >= 1 and r.breakdown.encoder_ms > 0 and r.breakdown.decoder_ms > 0
        assert r.throughput.images_per_s > 0 and r.throughput.captions_per_s == pytest.approx(r.throughput.images_per_s)
        assert r.speedup_vs_rerun is not None and r.speedup_reference == "torch-rerun fp32"
        assert r.memory.rss_peak_bytes and r.size.bytes > 0 and r.size.parameters
        assert r.quality is not None and r.quality.images == 4 and r.quality.delta_to_fp32 is not None
        assert r.load_s > 0 and len(r.timings_ms) == r.latency.count
        if r.runtime == "onnxruntime":  # --threads 1 --spin reached the sessions and each row records them
            assert (r.threads["intra_op"], r.threads["spin"], r.threads["policy"]) == (1, True, "explicit")
        else:
            assert r.threads is None
    by = {(r.runtime, r.beam, r.batch): r for r in report.results}
    assert by["torch-rerun", 2, 1].speedup_vs_rerun == pytest.approx(1.0)
    assert by["onnxruntime", 1, 1].size.files == ["onnx/fp32/init.onnx", "onnx/fp32/step.onnx"]
    assert by["torch", 1, 1].size.files == ["weights.safetensors"]
    # cached and re-run decoding compute the same function: the same captions, so the same CIDEr-D
    assert by["torch", 2, 1].quality.score == pytest.approx(by["torch-rerun", 2, 1].quality.score, abs=1e-9)
    assert report.bundles[0].quality_set and "test split" in report.bundles[0].quality_set

    text = (out / "report.md").read_text()
    assert "## Single-stream latency" in text and "speed-up vs re-run prefix" in text and "## Quality" in text
    assert "| ONNX Runtime threads |" in text and "| 1, spin |" in text
    for png in ("latency_vs_batch.png", "pareto.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def _cfg(bundle: Path, **overrides: object) -> BenchCfg:
    fast = {
        "batches": (2,),
        "beams": (1,),
        "quality": False,
        "synthetic": 2,
        "warmup": 1,
        "min_repeats": 2,
        "min_seconds": 0.0,
        "threads": 1,
    }
    return BenchCfg(bundles=(str(bundle),), **{**fast, **overrides})


def test_isolated_worker_returns_its_results(tiny_bundle: Path) -> None:
    report = run_benchmark(_cfg(tiny_bundle, runtimes=("torch",), isolate=True), progress=False)
    assert not report.errors
    assert [(r.runtime, r.batch, r.latency.count) for r in report.results] == [("torch", 2, 2)]
    assert report.results[0].memory.rss_peak_scope in ("combination", "process")
    assert "fresh Python process" in " ".join(report.notes)
    assert report.bundles[0].quality_note == "quality measurement switched off"


def test_a_failing_group_is_an_error_entry(tiny_bundle: Path) -> None:
    # The CPU onnxruntime build has no CUDA provider: the ort group fails to load, the torch group still runs.
    cfg = _cfg(tiny_bundle, runtimes=("onnxruntime", "torch"), providers=("cuda",), isolate=False)
    report = run_benchmark(cfg, progress=False)
    assert [r.runtime for r in report.results] == ["torch"]
    assert len(report.errors) == 1 and report.errors[0].runtime == "onnxruntime" and report.errors[0].batch is None
    assert "CUDAExecutionProvider" in report.errors[0].reason


def test_compare_cli(tmp_path: Path) -> None:
    write_report(make_report([make_result(times_ms=(10.0,) * 4)]), tmp_path / "a", plots=False)
    write_report(make_report([make_result(times_ms=(5.0,) * 4)]), tmp_path / "b", plots=False)
    result = CliRunner().invoke(
        bench,
        [
            "--compare",
            str(tmp_path / "a" / "report.json"),
            str(tmp_path / "b" / "report.json"),
            "--out",
            str(tmp_path / "cmp"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "| acort-xsmall | torch | fp32 | 3 | 1 | 10.0 | 5.00 | 0.50 |" in result.output
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["rows"][0]["p50_ms"]["ratio_b_over_a"] == 0.5
    assert (tmp_path / "cmp" / "compare.md").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give at least one --bundle"),
        (["--bundle", "B"], "--out DIR is required"),
        (["--bundle", "B", "--out", "o", "--images", "i", "--synthetic", "3"], "exclusive"),
        (["--bundle", "B", "--out", "o", "--batch", "1,x"], "expected integers"),
        (["--bundle", "B", "--out", "o", "--beam", "0"], "must be >= 1"),
        (["--bundle", "B", "--out", "o", "--runtime", "tensorflow"], "unknown ['tensorflow']"),
        (["--bundle", "does-not-exist", "--out", "o"], "bundle not found"),
        (["--compare", "a.json", "b.json", "--bundle", "B"], "do not pass --bundle"),
        (["--compare", "missing-a.json", "missing-b.json"], "report not found"),
    ],
)
def test_cli_errors(args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(bench, args)
    assert result.exit_code != 0
    assert message in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)  # a message, not a traceback


def test_images_on_a_feature_bundle_are_skipped(tiny_bundle: Path, tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (32, 32), "red").save(images / "a.png")
    result = CliRunner().invoke(
        bench,
        [
            "--bundle",
            str(tiny_bundle),
            "--images",
            str(images),
            "--runtime",
            "torch",
            "--no-quality",
            "--out",
            str(tmp_path / "o"),
            *FAST,
        ],
    )
    assert result.exit_code != 0
    assert "captions region features" in result.output and "nothing was measured" in result.output


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"bundles": ()}, "bundles"),
        ({"runtimes": ("torch", "trt")}, "runtimes"),
        ({"precisions": ("fp8",)}, "precisions"),
        ({"batches": (1, 0)}, "batches"),
        ({"beams": ()}, "beams"),
        ({"warmup": -1}, "warmup"),
        ({"min_repeats": 0}, "min_repeats"),
        ({"threads": -1}, "threads"),
        ({"threads": "many"}, "threads"),
        ({"spin": "yes"}, "spin"),
        ({"synthetic": 0}, "synthetic"),
    ],
)
def test_bench_cfg_validation(kwargs: dict, field: str) -> None:
    with pytest.raises(BenchCfgError, match=field):
        BenchCfg(**{"bundles": ("b",), **kwargs})


def test_bench_cfg_normalises_lists() -> None:
    cfg = BenchCfg(bundles=[Path("b")], batches=[1, 8, 1], runtimes=["torch"])
    assert cfg.bundles == ("b",) and cfg.batches == (1, 8) and cfg.runtimes == ("torch",)
    assert json.loads(json.dumps(cfg.to_dict()))["batches"] == [1, 8]


@pytest.mark.parametrize("level", ["9", "all"])
def test_length_level_on_a_bundle_without_length_control_is_refused_before_measuring(
    tiny_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: str
) -> None:
    from edgecap.bench import run as bench_run
    from edgecap.runtime.length import NO_LENGTH_CONTROL

    def no_measuring(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured before refusing the flag")

    monkeypatch.setattr(bench_run, "run_in_process", no_measuring)
    monkeypatch.setattr(bench_run, "run_isolated", no_measuring)
    args = ["--bundle", str(tiny_bundle), "--runtime", "torch", "--length-level", level, "--no-isolate"]
    result = CliRunner().invoke(bench, [*args, "--out", str(tmp_path / "o"), *FAST])
    assert result.exit_code != 0
    assert NO_LENGTH_CONTROL in result.output
    assert not (tmp_path / "o").exists()


def test_beam_above_max_beam_is_refused() -> None:
    from edgecap.runtime.decoding.config import MAX_BEAM

    assert BenchCfg(bundles=("b",), beams=(MAX_BEAM,)).beams == (MAX_BEAM,)
    with pytest.raises(BenchCfgError, match="MAX_BEAM"):
        BenchCfg(bundles=("b",), beams=(1, MAX_BEAM + 1))
    result = CliRunner().invoke(bench, ["--bundle", "B", "--out", "o", "--beam", str(MAX_BEAM + 1)])
    assert result.exit_code != 0 and f"at most MAX_BEAM ({MAX_BEAM})" in result.output
