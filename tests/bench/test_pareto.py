"""The compression view of a bench report (:mod:`edgecap.bench.compression`): the Pareto front on hand-made points,
the recipe each variant is named by, the table and the chart, and old bundles without any compression record."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from edgecap.bench.compression import (
    bundle_compression,
    bundle_labels,
    compression_lines,
    compression_rows,
    pareto_front,
    wants_compression_chart,
)
from edgecap.bench.markdown import fmt_ms
from edgecap.bench.report import BenchReport, BundleInfo, load_report, write_report

from .conftest import make_report, make_result


def _variant(precision: str, megabytes: float, cider: float | None, reference: float | None = None) -> dict[str, Any]:
    return {
        "precision": precision,
        "bytes": int(megabytes * 1e6),
        "cider_d": cider,
        "cider_d_reference": reference,
        "quality_set": "val split of data (100 images)" if cider is not None or reference is not None else None,
    }


def _bundle(path: str, manifest: dict[str, Any], variants: list[dict[str, Any]]) -> BundleInfo:
    precisions = [v["precision"] for v in variants]
    return BundleInfo(
        path,
        "acort-xsmall",
        "acort",
        1_000_000,
        precisions,
        "pixels",
        "efficientnet-lite0 in the encoder graph",
        variants,
        **bundle_compression(manifest, precisions),
    )


def _report(bundles: list[BundleInfo], results: list[Any]) -> BenchReport:
    report = make_report(results)
    return dataclasses.replace(report, bundles=bundles, config={**report.config, "runtimes": ["onnxruntime"]})


QAT = {"compression": {"steps": [{"kind": "qat", "epochs": 1}], "recipe": "qat"}}
AWARE = {"variants": {"int8": {"selection": {"kept_float": [{"layer": "a"}, {"layer": "b"}], "target": {}}}}}


def _compressed_report() -> BenchReport:
    base = _bundle(
        "/b/base",
        {},
        [_variant("fp32", 20.0, None, 0.80), _variant("fp16", 10.0, 0.79, 0.80), _variant("int8", 5.0, 0.74, 0.80)],
    )
    qat = _bundle("/b/qat", QAT, [_variant("fp32", 20.0, 0.81, 0.81), _variant("int8", 5.0, 0.80, 0.81)])
    results = [
        make_result("onnxruntime", "fp32", bundle="/b/base", times_ms=(40.0,) * 4),
        make_result("onnxruntime", "fp16", bundle="/b/base", times_ms=(45.0,) * 4),
        make_result("onnxruntime", "int8", bundle="/b/base", times_ms=(20.0,) * 4),
        make_result("onnxruntime", "int8", bundle="/b/base", batch=4, times_ms=(8.0,) * 4),
        make_result("onnxruntime", "fp32", bundle="/b/qat", times_ms=(40.0,) * 4),
        make_result("torch", "int8", bundle="/b/qat", times_ms=(99.0,) * 4),
        make_result("onnxruntime", "int8", bundle="/b/qat", times_ms=(21.0,) * 4),
    ]
    return _report([base, qat], results)


def test_pareto_front_drops_dominated_points_and_keeps_ties() -> None:
    points = [(1.0, 0.5), (2.0, 0.4), (2.0, 0.9), (3.0, 0.9), (0.5, 0.1), (2.0, 0.9)]
    # (2.0, 0.4) is beaten by (1.0, 0.5); (3.0, 0.9) costs more for the same quality; the two (2.0, 0.9) tie.
    assert pareto_front(points) == [4, 0, 2, 5]
    assert pareto_front([]) == [] and pareto_front([(1.0, 1.0)]) == [0]


def test_recipes_name_the_compression_and_the_int8_selection() -> None:
    plain = bundle_compression({}, ["fp32", "fp16", "int8"])
    assert plain == {
        "recipe": None,
        "variant_recipes": {"fp32": "baseline", "fp16": "baseline + fp16", "int8": "baseline + int8"},
        "int8_selection": None,
    }
    both = bundle_compression({**QAT, **AWARE}, ["fp32", "int8"])
    assert both["recipe"] == "qat"
    assert both["variant_recipes"] == {"fp32": "qat", "int8": "qat + int8 accuracy-aware (2 layers float)"}
    assert both["int8_selection"] == AWARE["variants"]["int8"]["selection"]
    one = {"variants": {"int8": {"selection": {"kept_float": [{"layer": "a"}]}}}}
    label = bundle_compression(one, ["int8"])["variant_recipes"]["int8"]
    assert label == "baseline + int8 accuracy-aware (1 layer float)"
    # malformed or foreign records read as an uncompressed bundle, not as an error
    odd = {"compression": ["qat"], "variants": {"int8": {"selection": "yes"}}}
    assert bundle_compression(odd, ["int8"])["variant_recipes"] == {"int8": "baseline + int8"}


def test_rows_take_manifest_cider_batch_one_latency_and_mark_both_fronts() -> None:
    rows = {(Path(r.bundle).name, r.precision): r for r in compression_rows(_compressed_report())}
    assert set(rows) == {("base", "fp32"), ("base", "fp16"), ("base", "int8"), ("qat", "fp32"), ("qat", "int8")}
    base_fp32, base_int8, qat_int8 = rows["base", "fp32"], rows["base", "int8"], rows["qat", "int8"]
    assert base_fp32.cider_d == pytest.approx(80.0)  # FP32 reads the reference of its bundle's checks
    assert base_fp32.recipe == "baseline" and qat_int8.recipe == "qat + int8"
    assert base_int8.size_mb == pytest.approx(5.0) and base_int8.latency_ms == pytest.approx(20.0)  # batch 1 only
    assert qat_int8.runtime == "onnxruntime" and qat_int8.latency_ms == pytest.approx(21.0)  # the run's first runtime
    # size front: qat int8 (5 MB, 80) beats base int8 (5 MB, 74); qat fp32 (20 MB, 81) is the best quality
    assert {k for k, r in rows.items() if r.on_size_front} == {("qat", "int8"), ("qat", "fp32")}
    # latency front: base int8 (20 ms) is fastest, qat int8 (21 ms, 80) next, qat fp32 (40 ms, 81) best
    assert {k for k, r in rows.items() if r.on_latency_front} == {("base", "int8"), ("qat", "int8"), ("qat", "fp32")}
    assert not rows["base", "fp16"].on_size_front and not rows["base", "fp16"].on_latency_front


def test_table_names_recipes_and_the_quality_set() -> None:
    text = "\n".join(compression_lines(_compressed_report(), fmt_ms))
    assert "| qat | int8 | qat + int8 | 5.00 | 21.0 | onnxruntime, b3 | 80.0 | SL |" in text
    assert "| base | fp16 | baseline + fp16 | 10.00 | 45.0 | onnxruntime, b3 | 79.0 | – |" in text
    assert "CIDEr-D measured on: base: val split of data (100 images); qat: val split of data (100 images)" in text


def test_report_with_variants_writes_the_chart_and_round_trips(tmp_path: Path) -> None:
    report = _compressed_report()
    written = write_report(report, tmp_path)
    chart = written["compression_pareto"]
    assert chart == tmp_path / "compression_pareto.png" and chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (tmp_path / "report.md").read_text()
    assert "## Compression variants" in markdown and "![compression pareto](compression_pareto.png)" in markdown
    again = load_report(tmp_path)  # validated against report.schema.json
    assert again.bundles[1].recipe == "qat"
    assert again.bundles[1].variant_recipes == {"fp32": "qat", "int8": "qat + int8"}


def test_bundles_with_the_same_directory_name_are_told_apart() -> None:
    assert bundle_labels(["/a/bundles/acort", "/meas/x/acort", "/b/other"]) == {
        "/a/bundles/acort": "bundles/acort",
        "/meas/x/acort": "x/acort",
        "/b/other": "other",
    }


def test_old_bundles_and_old_reports_still_work(tmp_path: Path) -> None:
    report = make_report([make_result(quality=0.5)])  # a bundle without quality records, compression or new fields
    assert report.bundles[0].recipe is None and report.bundles[0].variant_recipes is None
    rows = compression_rows(report)
    assert [r.recipe for r in rows] == ["baseline", "baseline + int8"]
    assert all(r.cider_d is None and r.size_mb is None for r in rows) and not wants_compression_chart(rows)
    assert compression_lines(report, fmt_ms) == []  # nothing to compare: no section
    written = write_report(report, tmp_path)
    assert "compression_pareto" not in written and not (tmp_path / "compression_pareto.png").exists()
    assert "Compression variants" not in (tmp_path / "report.md").read_text()
    data = report.to_dict()
    for b in data["bundles"]:
        for key in ("recipe", "variant_recipes", "int8_selection"):
            del b[key]
    assert BenchReport.from_dict(data).bundles[0].variant_recipes is None


def test_one_compressed_bundle_gets_its_table_without_a_chart() -> None:
    bundle = _bundle("/b/pruned", {"compression": {"recipe": "pruning"}}, [_variant("fp32", 12.0, 0.7, 0.7)])
    report = _report([bundle], [make_result("onnxruntime", "fp32", bundle="/b/pruned", batch=2)])
    rows = compression_rows(report)
    assert not wants_compression_chart(rows)
    text = "\n".join(compression_lines(report, fmt_ms))
    assert "| pruned | fp32 | pruning | 12.00 | – | not timed at batch 1 | 70.0 | S |" in text  # no latency: no L
