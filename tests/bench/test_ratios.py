"""Headline ratios from hand-made results with known breakdowns: which pairs are compared and the arithmetic."""

from __future__ import annotations

import dataclasses

import pytest

from edgecap.bench.markdown import format_markdown
from edgecap.bench.ratios import (
    BACKBONE_COMPARISON,
    decode_ms,
    headline_ratios,
    loop_ms,
    ratio_lines,
    ratio_series,
    series_lines,
)
from edgecap.bench.report import Quality
from tests.bench.conftest import make_report, make_result, replace


def _with(result, **breakdown):  # type: ignore[no-untyped-def]
    return replace(result, breakdown=dataclasses.replace(result.breakdown, **breakdown))


def _results():  # type: ignore[no-untyped-def]
    rerun = _with(make_result("torch-rerun", times_ms=(40.0,)), decoder_ms=30.0, decoder_step_ms=3.0)
    torch = _with(make_result("torch", times_ms=(20.0,)), decoder_ms=12.0, decoder_step_ms=1.2)
    onnxruntime = _with(
        make_result("onnxruntime", times_ms=(10.0,), size=8 << 20), decoder_ms=4.0, decoder_step_ms=0.4, encoder_ms=0.8
    )
    int8 = _with(make_result("onnxruntime", "int8", times_ms=(8.0,), size=2 << 20), decoder_ms=3.0, encoder_ms=0.5)
    q = Quality("CIDEr-D", 0.80, 20, "set", 3)
    onnxruntime = replace(onnxruntime, quality=q)
    int8 = replace(int8, quality=dataclasses.replace(q, score=0.795))
    return rerun, torch, onnxruntime, int8


def test_spans_add_up() -> None:
    _, torch, _, _ = _results()
    assert loop_ms(torch.breakdown) == pytest.approx(12.0 + 0.5 + 0.5)
    assert decode_ms(torch.breakdown) == pytest.approx(1.0 + 13.0)


def test_headline_ratios_pair_the_promised_comparisons() -> None:
    rerun, torch, onnxruntime, int8 = _results()
    ratios = {h.comparison: h for h in headline_ratios([int8, onnxruntime, torch, rerun])}
    assert list(ratios) == ["cached vs re-run prefix", "onnxruntime vs torch", "int8 vs fp32"]
    cached = ratios["cached vs re-run prefix"]
    assert cached.loop_speedup == pytest.approx(31.0 / 13.0) and cached.step_speedup == pytest.approx(2.5)
    assert cached.end_to_end_speedup == pytest.approx(2.0)
    onnxruntime_vs_torch = ratios["onnxruntime vs torch"]
    assert onnxruntime_vs_torch.decode_speedup == pytest.approx(
        14.0 / 5.8
    ) and onnxruntime_vs_torch.step_speedup == pytest.approx(3.0)
    q8 = ratios["int8 vs fp32"]
    assert q8.encoder_speedup == pytest.approx(0.8 / 0.5) and q8.size_ratio == pytest.approx(0.25)
    assert q8.quality_delta == pytest.approx(-0.5)
    assert ratios["onnxruntime vs torch"].quality_delta is None  # torch's quality was not measured


def test_ratios_only_compare_the_same_bundle_beam_and_batch() -> None:
    rerun, torch, onnxruntime, _ = _results()
    other = [replace(torch, batch=8), replace(onnxruntime, beam=1), replace(rerun, bundle="/bundles/other")]
    assert headline_ratios(other) == []
    assert ratio_lines(other) == []
    assert [
        h.batch for h in headline_ratios([torch, onnxruntime, replace(torch, batch=8), replace(onnxruntime, batch=8)])
    ] == [1, 8]


def test_report_markdown_leads_with_the_ratios() -> None:
    text = format_markdown(make_report(list(_results())))
    section = text.index("## Headline ratios")
    assert section < text.index("## Single-stream latency")
    row = "| onnxruntime vs torch | acort-xsmall | 3 | 1 | onnxruntime fp32 / torch fp32 |"
    assert row + " 2.60× | 3.00× | 2.41× | 2.00× |" in text


def test_ratio_series_collects_each_comparison_across_reports() -> None:
    rerun, torch, onnxruntime, _ = _results()
    slower_torch = _with(torch, decoder_ms=9.0, decoder_step_ms=0.9)  # loop 10 ms against ORT's 5 ms: 2.0x
    reports = [
        [torch, onnxruntime, rerun],
        [slower_torch, onnxruntime],
        [onnxruntime],
    ]  # the third holds no complete comparison
    series = {s.comparison: s for s in ratio_series(reports)}
    assert list(series) == ["cached vs re-run prefix", "onnxruntime vs torch"]
    onnxruntime_vs_torch = series["onnxruntime vs torch"]
    assert onnxruntime_vs_torch.runs == 2 and onnxruntime_vs_torch.subject == "onnxruntime fp32"
    assert onnxruntime_vs_torch.baseline == "torch fp32"
    assert onnxruntime_vs_torch.loop == pytest.approx((13.0 / 5.0, 10.0 / 5.0))
    assert onnxruntime_vs_torch.step == pytest.approx((3.0, 2.25))
    assert onnxruntime_vs_torch.below(2.5) == 1 and onnxruntime_vs_torch.below(2.0) == 0
    assert series["cached vs re-run prefix"].runs == 1


def test_series_lines_show_median_range_and_runs_below_the_target() -> None:
    _, torch, onnxruntime, _ = _results()
    reports = [[_with(torch, decoder_ms=ms), onnxruntime] for ms in (9.0, 12.0, 14.0)]  # loops 10, 13, 15 ms over 5 ms
    lines = series_lines(ratio_series(reports), target=2.5)
    assert lines[0].endswith("| decode | end to end | judged < 2.5× |")
    row = "| onnxruntime vs torch | acort-xsmall | 3 | 1 | onnxruntime fp32 / torch fp32 | 3 | 2.60× (2.00–3.00) |"
    assert lines[2].startswith(row)
    assert lines[2].endswith("| 1 of 3 (loop) |")
    assert series_lines(ratio_series(reports), target=2.5, span="step")[2].endswith("(step) |")
    assert "judged <" not in series_lines(ratio_series(reports))[0]


def test_a_backbone_series_pairs_the_bundles_and_is_judged_on_the_span_the_caller_chooses() -> None:
    """Reports of a pixels-in and a torch-backbone bundle of one run: the series pairs them (bundles passed along)
    and counts the runs below the target on the span the caller names (the benchmark script: end to end)."""
    reports = [(_backbone_results(), _backbone_bundles()) for _ in range(3)]
    (series,) = [s for s in ratio_series(reports) if s.comparison == BACKBONE_COMPARISON]
    assert series.runs == 3 and series.values("end_to_end") == series.end_to_end and len(series.end_to_end) == 3
    assert series.below(100.0, "end_to_end") == 3 and series.below(0.1, "end_to_end") == 0
    with pytest.raises(ValueError, match="unknown span"):
        series.values("judged")
    assert not [s for s in ratio_series([r for r, _ in reports]) if s.comparison == BACKBONE_COMPARISON]


def _backbone_bundles(run_b: str = "run-a"):  # type: ignore[no-untyped-def]
    from edgecap.bench.report import BundleInfo

    graph = BundleInfo("/b/pixels", "m", "acort", 1, ["int8"], "pixels", "eff in the encoder graph", [], run="run-a")
    torch = BundleInfo("/b/torch", "m", "acort", 1, ["int8"], "pixels", "eff in torch", [], run=run_b)
    return [graph, torch]


def _backbone_results():  # type: ignore[no-untyped-def]
    pixels = _with(
        make_result("onnxruntime", "int8", times_ms=(10.0,), bundle="/b/pixels", size=3 << 20),
        encoder_ms=4.0,
        decoder_ms=4.0,
    )
    pixels = replace(pixels, input="pixels", backbone="graph")
    eager = _with(
        make_result("onnxruntime", "int8", times_ms=(25.0,), bundle="/b/torch", size=2 << 20),
        backbone_ms=15.0,
        encoder_ms=1.0,
        decoder_ms=4.0,
    )
    return pixels, replace(eager, input="pixels", backbone="torch")


def test_pixels_in_is_compared_with_the_same_runs_torch_backbone_bundle() -> None:
    pixels, eager = _backbone_results()
    ratios = headline_ratios([eager, pixels], _backbone_bundles())
    assert [h.comparison for h in ratios] == ["pixels-in vs torch backbone"]
    h = ratios[0]
    assert (h.subject, h.baseline) == ("onnxruntime int8 pixels-in", "onnxruntime int8 + torch backbone")
    assert h.end_to_end_speedup == pytest.approx(2.5)
    assert h.encoder_speedup == pytest.approx((15.0 + 1.0) / 4.0)  # the baseline's torch backbone counts
    assert h.decode_speedup == pytest.approx((15.0 + 1.0 + 5.0) / (4.0 + 5.0))
    lines = "\n".join(ratio_lines([pixels, eager], _backbone_bundles()))
    row = "onnxruntime int8 pixels-in / onnxruntime int8 + torch backbone"
    assert row in lines and "≥" not in lines  # no target in a report


def test_bundles_of_different_runs_or_precisions_are_not_paired() -> None:
    pixels, eager = _backbone_results()
    assert headline_ratios([pixels, eager], _backbone_bundles(run_b="run-b")) == []
    assert headline_ratios([pixels, replace(eager, precision="fp32")], _backbone_bundles()) == []
    assert headline_ratios([pixels, eager]) == []  # no bundle identities: nothing to pair on


def test_bundles_sharing_a_model_name_are_told_apart() -> None:
    _, torch, onnxruntime, _ = _results()
    results = [replace(r, bundle=f"/b/{name}") for name in ("pixels", "eager") for r in (torch, onnxruntime)]
    assert sorted(h.model for h in headline_ratios(results)) == ["acort-xsmall (eager)", "acort-xsmall (pixels)"]
    assert [h.model for h in headline_ratios([torch, onnxruntime])] == ["acort-xsmall"]
