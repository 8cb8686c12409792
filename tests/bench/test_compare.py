"""Two reports side by side: matching, exact ratios, one-sided rows, environment differences, markdown."""

from __future__ import annotations

import dataclasses
import json

import pytest

from edgecap.bench.compare import compare_reports, format_comparison, ratio

from .conftest import make_report, make_result


def _pair():
    a = make_report(
        [
            make_result("torch", times_ms=(10.0, 10.0, 10.0, 10.0), quality=1.00, rss=400 << 20),
            make_result("onnxruntime", times_ms=(8.0, 8.0, 8.0, 8.0)),
            make_result("torch-rerun", times_ms=(50.0, 50.0, 50.0, 50.0)),
        ]
    )
    b = make_report(
        [
            make_result("torch", times_ms=(20.0, 20.0, 20.0, 20.0), quality=1.10, rss=200 << 20),
            make_result("onnxruntime", times_ms=(4.0, 4.0, 4.0, 4.0)),
            make_result("onnxruntime", "int8", times_ms=(2.0, 2.0, 2.0, 2.0)),
        ],
        cpu="Jetson CPU",
        versions={"edgecap": "0.2.0", "torch": "2.0"},
    )
    return a, b


def test_ratio() -> None:
    assert ratio(6.0, 3.0) == 2.0
    assert ratio(None, 3.0) is None and ratio(1.0, None) is None and ratio(1.0, 0) is None


def test_matched_rows_and_ratios() -> None:
    a, b = _pair()
    comparison = compare_reports(a, b, labels=("laptop", "jetson"))
    rows = {row.key: row for row in comparison.rows}
    torch_row = rows["acort-xsmall", "torch", "fp32", 3, 1]
    assert torch_row.values["p50_ms"] == pytest.approx((10.0, 20.0, 2.0))
    assert torch_row.values["images_per_s"] == pytest.approx((100.0, 50.0, 0.5))
    assert torch_row.values["peak_rss_bytes"] == pytest.approx((400 << 20, 200 << 20, 0.5))
    assert torch_row.values["cider_d"] == pytest.approx((100.0, 110.0, 1.1))
    assert torch_row.values["gpu_peak_bytes"] == (None, None, None)
    assert rows["acort-xsmall", "onnxruntime", "fp32", 3, 1].values["p50_ms"] == pytest.approx((8.0, 4.0, 0.5))
    assert comparison.only_a == [("acort-xsmall", "torch-rerun", "fp32", 3, 1, "acort")]
    assert comparison.only_b == [("acort-xsmall", "onnxruntime", "int8", 3, 1, "acort")]
    assert comparison.environment["cpu"] == ("Test CPU", "Jetson CPU")
    assert comparison.environment["versions.edgecap"] == ("0.1.0", "0.2.0")
    assert "versions.torch" not in comparison.environment


def test_two_bundles_of_one_model_are_told_apart() -> None:
    a = make_report(
        [make_result(bundle="/x/v1", times_ms=(10.0,) * 4), make_result(bundle="/x/v2", times_ms=(20.0,) * 4)]
    )
    b = make_report(
        [make_result(bundle="/y/v1", times_ms=(5.0,) * 4), make_result(bundle="/y/v2", times_ms=(40.0,) * 4)]
    )
    comparison = compare_reports(a, b)
    rows = {row.bundles: row.values["p50_ms"][2] for row in comparison.rows}
    assert rows == pytest.approx({("v1", "v1"): 0.5, ("v2", "v2"): 2.0})  # matched by bundle directory name
    assert "| v1 | acort-xsmall | torch |" in format_comparison(comparison)
    # A has two bundles of the model, B one under another name: ambiguous, so nothing is paired by guesswork
    single = make_report([make_result(bundle="/z/other", times_ms=(30.0,) * 4)])
    comparison = compare_reports(a, single)
    assert comparison.rows == [] and len(comparison.only_a) == 2 and len(comparison.only_b) == 1
    # the same bundle under another directory name: paired by the combination alone
    comparison = compare_reports(make_report([make_result(bundle="/x/v1", times_ms=(10.0,) * 4)]), single)
    assert comparison.rows[0].values["p50_ms"][2] == pytest.approx(3.0)
    assert comparison.rows[0].bundles == ("v1", "other")


def test_markdown_and_json() -> None:
    a, b = _pair()
    comparison = compare_reports(a, b, labels=("A.json", "B.json"))
    text = format_comparison(comparison)
    assert "A = A.json, B = B.json" in text
    assert "| acort-xsmall | torch | fp32 | 3 | 1 | 10.0 | 20.0 | 2.00 |" in text
    assert "| acort-xsmall | onnxruntime | fp32 | 3 | 1 | 8.00 | 4.00 | 0.50 |" in text
    assert "Only in A:\n\n- acort-xsmall torch-rerun fp32 3 1 acort" in text
    assert "p50 ms ↓ A" in text and "images/s ↑ A" in text
    assert "| cpu | Test CPU | Jetson CPU |" in text
    data = json.loads(json.dumps(comparison.to_dict(), allow_nan=False))
    assert data["rows"][0]["p50_ms"] == {"a": 10.0, "b": 20.0, "ratio_b_over_a": 2.0}
    assert data["rows"][0]["runtime"] == "torch"


def test_nothing_in_common() -> None:
    a = make_report([make_result("torch")])
    b = make_report([make_result("onnxruntime")])
    text = format_comparison(compare_reports(a, b))
    assert "No combination appears in both reports." in text


def test_per_level_results_are_matched_level_by_level() -> None:
    def report(*p50: float):
        rows = [make_result("onnxruntime", times_ms=(t,) * 4, model="labert-xsmall") for t in p50]
        return make_report([dataclasses.replace(r, length_level=i) for i, r in enumerate(rows, start=1)])

    comparison = compare_reports(report(10.0, 20.0), report(5.0, 40.0))
    rows = {row.key: row for row in comparison.rows}
    assert rows["labert-xsmall L1", "onnxruntime", "fp32", 3, 1].values["p50_ms"] == pytest.approx((10.0, 5.0, 0.5))
    assert rows["labert-xsmall L2", "onnxruntime", "fp32", 3, 1].values["p50_ms"] == pytest.approx((20.0, 40.0, 2.0))
