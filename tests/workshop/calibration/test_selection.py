"""Accuracy-aware INT8 on a real exported captioner (acort-test, features in): layers found in the exporter's graphs,
ranked by leave-one-out decoding, selected against a held-out check, recorded with latency; a target nothing meets
fails naming the best reached."""

from __future__ import annotations

from typing import Any

import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from edgecap.workshop.export.bundling import BundleExportError  # noqa: E402
from edgecap.workshop.export.bundling.console import Stages  # noqa: E402
from edgecap.workshop.export.bundling.selection import Int8Selector, ranking_batches  # noqa: E402
from edgecap.workshop.export.calibration import quantize_int8  # noqa: E402
from edgecap.workshop.export.calibration.layers import param_index, quantised_layers  # noqa: E402
from edgecap.workshop.export.calibration.presets import get_preset  # noqa: E402
from edgecap.workshop.export.calibration.sensitivity import Int8Target  # noqa: E402

PRESET = get_preset("cpu-avx2").with_step_scheme("static")


@pytest.fixture(scope="module")
def quantized(acort, region_feeds, tmp_path_factory) -> tuple[Any, dict[str, Any], list]:
    work = tmp_path_factory.mktemp("select")
    feeds = region_feeds(2, batch=4, seed=1)
    result = quantize_int8(acort.fp32, acort.spec, feeds, acort.cfg("greedy"), PRESET, workdir=work, progress=False)
    originals = {role: onnx.load(str(work / f"{role}.fp32-pre.onnx")) for role in result.models}
    return result, originals, feeds


def dq_inputs(model) -> int:
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    return sum(1 for n in model.graph.node for i in n.input if producer.get(i) == "DequantizeLinear")


def selector(acort, check, target: Int8Target) -> Int8Selector:
    return Int8Selector(
        target, check, acort.spec, acort.cfg("greedy"), acort.vocab, param_index(acort.model.named_parameters()), 4
    )


def test_layers_of_exported_graphs_are_named_by_the_torch_modules(acort, quantized):
    result, originals, _ = quantized
    params = param_index(acort.model.named_parameters())
    names = [
        x.name
        for role in ("encoder", "step")
        for x in quantised_layers(result.models[role], originals[role], role, ("MatMul", "Gemm"), params)
    ]
    assert "output_proj" in names  # the logits projection, a Gemm with its own weight
    assert sum(1 for n in names if not n.startswith("node_")) >= len(names) // 2


def test_selection_keeps_the_fewest_ranked_layers_that_meet_the_check(acort, quantized):
    result, originals, feeds = quantized
    full = sum(dq_inputs(m) for m in result.models.values())
    seen: list[int] = []

    def check(models) -> dict[str, Any]:  # quality grows as Q/DQ inputs go: monotone in the layers kept float
        left = sum(dq_inputs(m) for m in models.values())
        seen.append(left)
        return {"reference_cider_d": 0.5, "candidate_cider_d": 0.5, "agreement": 1.0 - left / full, "images": 4}

    op_types = {role: ("MatMul", "Gemm") for role in originals}
    graphs, record = selector(acort, check, Int8Target(min_agreement=0.05)).select(
        acort.fp32, result.models, originals, op_types, feeds, Stages(1, False)
    )
    kept = record["kept_float"]
    assert 1 <= len(kept) < record["layers_considered"] and record["ranking"]["images"] == 4
    assert record["quality"]["agreement"] >= 0.05 and record["full_int8_quality"]["agreement"] == 0.0
    assert record["search"]["tried"]["0"] is False and record["search"]["tried"][str(len(kept))] is True
    assert set(record["latency"]) >= {"fp32", "int8", "selected", "batch", "threads"}
    assert record["latency"]["selected"]["encoder_ms"] > 0 and record["latency"]["threads"] == 1
    assert sum(dq_inputs(m) for m in graphs.values()) < full  # the returned graphs hold the float layers
    from edgecap.runtime.backends.onnxruntime.decoders import create_onnxruntime_decoder
    from edgecap.runtime.decoding import decode

    with create_onnxruntime_decoder(graphs, acort.spec.state_names, acort.spec.step_state_names) as model:
        assert len(decode(model, feeds[0], acort.cfg("greedy"))) == 4


def test_a_target_nothing_meets_fails_naming_the_best_reached(acort, quantized):
    result, originals, feeds = quantized

    def check(models) -> dict[str, Any]:
        return {"reference_cider_d": 0.5, "candidate_cider_d": 0.4, "agreement": 0.5, "images": 4}

    op_types = {role: ("MatMul", "Gemm") for role in originals}
    with pytest.raises(BundleExportError, match=r"cannot meet the target .* Best reached: .*10\.00 points"):
        selector(acort, check, Int8Target(max_cider_drop=0.3)).select(
            acort.fp32, result.models, originals, op_types, feeds, Stages(1, False)
        )


def test_ranking_batches_cut_at_the_image_count(region_feeds):
    cut = ranking_batches(region_feeds(3, batch=4), 6)
    assert [b["features"].shape[0] for b in cut] == [4, 2]
