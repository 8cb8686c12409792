"""``edgecap bench`` on a LaBERT bundle: mask-predict on torch and ORT, one result per length level (recorded in the
report), ``torch-rerun`` skipped with a reason, refinement passes timed as the decoder."""

from __future__ import annotations

import pytest

from edgecap.bench.markdown import format_markdown
from edgecap.bench.report import load_report, write_report
from edgecap.bench.run import BenchCfg, BenchCfgError, run_benchmark
from edgecap.runtime.bundle import load_bundle
from tests.runtime.bundle.helpers import labert_bundle

pytestmark = pytest.mark.usefixtures("flush_denormals")


def test_labert_bundle_is_benchmarked_per_length_level(tiny_data, tmp_path_factory, tmp_path):
    bundle, _ = labert_bundle(tiny_data, tmp_path_factory)
    steps = load_bundle(bundle, graphs="none").interface["length"]["refine_steps"]
    cfg = BenchCfg(
        bundles=(str(bundle),),
        runtimes=("torch", "torch-rerun", "onnxruntime"),
        precisions=("fp32",),
        batches=(1,),
        beams=(3,),
        length_levels=(1, 3, 9),
        synthetic=2,
        quality=False,
        warmup=1,
        min_repeats=2,
        min_seconds=0.0,
        isolate=False,
        tegrastats=False,
    )
    report = run_benchmark(cfg, progress=False)
    assert not report.errors
    measured = sorted((r.runtime, r.length_level, r.beam) for r in report.results)
    assert measured == [("onnxruntime", 1, 1), ("onnxruntime", 3, 1), ("torch", 1, 1), ("torch", 3, 1)]
    for r in report.results:
        assert r.breakdown.steps == steps[r.length_level - 1]  # one decoder call per refinement pass
        assert r.breakdown.encoder_ms > 0 and r.breakdown.decoder_ms > 0 and r.breakdown.select_ms == 0
    reasons = {(s.runtime, s.reason) for s in report.skipped}
    assert any(rt == "torch-rerun" and "mask-predict bundle has no prefix" in why for rt, why in reasons)
    assert any("length level 9: the bundle has levels 1..4" in why for _, why in reasons)

    write_report(report, tmp_path, plots=False)
    assert sorted(r.length_level for r in load_report(tmp_path).results) == [1, 1, 3, 3]
    header = next(line for line in format_markdown(report).splitlines() if line.startswith("| model |"))
    assert header.startswith("| model | runtime | precision | beam | length level |")


def test_length_levels_must_be_levels_or_all():
    assert BenchCfg(bundles=("b",), length_levels="all").length_levels == "all"
    with pytest.raises(BenchCfgError, match="1-based"):
        BenchCfg(bundles=("b",), length_levels=(0, 2))
    with pytest.raises(BenchCfgError, match="'all'"):
        BenchCfg(bundles=("b",), length_levels="some")


def test_cli_length_level_all_measures_every_level(tiny_data, tmp_path_factory, tmp_path):
    from click.testing import CliRunner

    from edgecap.cli import main

    bundle, _ = labert_bundle(tiny_data, tmp_path_factory)
    common = ["bench", "--bundle", str(bundle), "--runtime", "onnxruntime", "--batch", "1", "--out", str(tmp_path)]
    bad = CliRunner().invoke(main, [*common, "--length-level", "short"])
    assert bad.exit_code == 2 and "--length-level" in bad.output
    quick = ["--synthetic", "1", "--warmup", "0", "--min-repeats", "1", "--min-seconds", "0", "--no-quality"]
    result = CliRunner().invoke(main, [*common, *quick, "--no-isolate", "--no-plots", "--length-level", "all"])
    assert result.exit_code == 0, result.output
    assert [r.length_level for r in load_report(tmp_path).results] == [1, 2, 3, 4]
