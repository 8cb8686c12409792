"""Parity ladder: every graph of every registered test config, at fp32 and fp16, against torch on fresh inputs.

Also the ``check_runtime`` helper itself (Polygraphy's ``check_runner``) on a torch runtime, so a broken comparison
cannot hide behind a passing export.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from edgecap.workshop.export import Tolerance
from edgecap.workshop.export.parity import ParityError, check_graph, check_runtime, compare_arrays, torch_reference
from edgecap.workshop.torch_runtime.runtime import TorchRuntime
from tests.workshop.export.helpers import (
    BACKBONE_FAMILIES,
    TEST_CONFIGS,
    decoder_graph,
    exported,
    exported_family_with_backbone,
    exported_with_backbone,
    graph_cases,
)

PRECISIONS = ("fp32", "fp16")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize(("config", "graph"), graph_cases())
def test_graph_parity_on_fresh_inputs(config: str, graph: str, precision: str) -> None:
    result = exported(config)
    spec = result.spec
    # A seed unrelated to the export example (seed 0) and to export's own parity run.
    report = check_graph(spec, graph, result.model(graph, precision), precision, seed=99)
    failed = {n: o for n, o in report["outputs"].items() if not o["passed"]}
    assert report["passed"], f"{config}/{graph}/{precision}: {failed}"
    assert set(report["outputs"]) == set(spec.graph(graph).outputs)
    # the ladder covered batch 1 and > 1 and, for the step, an empty and a non-empty cache
    batches = {s["batch"] for s in report["sizes"]}
    assert 1 in batches and max(batches) > 1
    grows = any("past" in axes.values() for axes in spec.graph(graph).dynamic_axes.values())
    if graph == "step" and grows:  # a recurrent state (Image Transformer's LSTM) has no cache length
        assert {s["past"] for s in report["sizes"]} >= {0, spec.dims["past"].max}
    # tolerances come from the spec, per precision
    tol = spec.graph(graph).tolerance(precision, spec.graph(graph).outputs[0])
    first = report["outputs"][spec.graph(graph).outputs[0]]
    assert (first["atol"], first["rtol"]) == (tol.atol, tol.rtol)


@pytest.mark.parametrize("config", TEST_CONFIGS)
def test_export_records_parity_reports(config: str) -> None:
    result = exported(config)
    assert result.parity_passed is True
    for entry in result.graphs.values():
        assert entry.parity["graph"] == entry.name and entry.parity["precision"] == entry.precision
        assert entry.parity["feeds"] == len(result.spec.parity_sizes)
    fp16_step = result.get(decoder_graph(result.spec), "fp16").parity["outputs"]["logprobs"]
    fp32_step = result.get(decoder_graph(result.spec), "fp32").parity["outputs"]["logprobs"]
    assert fp16_step["max_abs"] > fp32_step["max_abs"]  # fp16 really is a different graph


def test_fp32_is_tighter_than_fp16_in_every_spec() -> None:
    for config in TEST_CONFIGS:
        spec = exported(config).spec
        for graph in spec.graphs:
            for output in graph.outputs:
                fp32, fp16 = graph.tolerance("fp32", output), graph.tolerance("fp16", output)
                assert fp32.atol < fp16.atol and fp32.rtol <= fp16.rtol


@pytest.mark.parametrize("precision", PRECISIONS)
def test_backbone_graphs_parity(precision: str) -> None:
    result = exported_with_backbone()
    assert result.spec.decode_inputs == ("pixel_values",)
    for graph in ("encoder", "start", "init"):
        report = check_graph(result.spec, graph, result.model(graph, precision), precision, seed=5)
        assert report["passed"], (graph, report["outputs"])


@pytest.mark.parametrize("config", BACKBONE_FAMILIES)
def test_every_graph_of_a_pixels_in_export_passes_parity(config: str) -> None:
    """Backbone + encoder in one graph, in every family: every graph at FP32 (tight) and FP16 (looser) against torch,
    on fresh pixels (a seed other than the export's own parity run)."""
    result = exported_family_with_backbone(config)
    spec = result.spec
    assert spec.decode_inputs[0] == "pixel_values" and spec.dims["regions"].min == spec.dims["regions"].max
    for graph in spec.graph_names:
        worst = {}
        for precision in PRECISIONS:
            report = check_graph(spec, graph, result.model(graph, precision), precision, seed=7)
            failed = {n: o for n, o in report["outputs"].items() if not o["passed"]}
            assert report["passed"], f"{config}/{graph}/{precision}: {failed}"
            assert result.get(graph, precision).parity["passed"]  # the export's own check agreed
            worst[precision] = max(o["max_abs"] for o in report["outputs"].values())
        if graph in ("encoder", "init"):  # the backbone's convolutions are in these: FP16 shows, FP32 barely
            assert worst["fp32"] < 1e-3 and worst["fp32"] <= worst["fp16"], (graph, worst)


def test_labert_encoder_takes_pixels_and_refine_is_unchanged() -> None:
    result = exported_family_with_backbone("labert-test")
    encoder, refine = result.model("encoder"), result.model("refine")
    assert [i.name for i in encoder.graph.input] == ["pixel_values"]
    assert [o.name for o in encoder.graph.output] == ["visual", "visual_bias"]
    assert [i.name for i in refine.graph.input] == ["tokens", "length_level", "visual", "visual_bias"]
    meta = {p.key: p.value for p in encoder.metadata_props}
    assert meta["backbone"] == "test_resnet" and meta["image_size"] == "64" and "length_levels" in meta
    assert result.spec.decoding == "mask_predict" and result.spec.decode_inputs == ("pixel_values",)


# -- the helper ----------------------------------------------------------------------------------------------------
class Affine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.linear(x)
        return y, y.argmax(-1)


def _runtime_and_feeds() -> tuple[TorchRuntime, list[dict[str, np.ndarray]], Affine]:
    torch.manual_seed(0)
    module = Affine().eval()
    runtime = TorchRuntime(module, {"x": ("float32", ("batch", 4))}, ["y", "label"])
    g = np.random.default_rng(0)
    feeds = [{"x": g.standard_normal((b, 4)).astype(np.float32)} for b in (1, 5)]
    return runtime, feeds, module


def test_check_runtime_passes_identical_computation() -> None:
    runtime, feeds, module = _runtime_and_feeds()
    report = check_runtime(runtime, torch_reference(module, ["x"], ["y", "label"]), feeds, Tolerance(1e-6))
    assert report["passed"] and report["feeds"] == 2
    assert report["outputs"]["y"]["max_abs"] == 0.0 and report["outputs"]["label"]["violations"] == 0
    assert not runtime.is_active  # activated and closed by the helper


def test_check_runtime_reports_violations_per_output() -> None:
    runtime, feeds, module = _runtime_and_feeds()
    reference = torch_reference(module, ["x"], ["y", "label"])

    def perturbed(feed):
        out = reference(feed)
        out["y"] = out["y"] + np.where(np.arange(out["y"].size).reshape(out["y"].shape) == 0, 1e-3, 0).astype(
            np.float32
        )
        return out

    tolerances = {"y": Tolerance(atol=1e-4), "label": Tolerance(atol=0)}
    report = check_runtime(runtime, perturbed, feeds, tolerances)
    assert not report["passed"]
    y = report["outputs"]["y"]
    assert not y["passed"] and y["violations"] == 2 and y["max_abs"] == pytest.approx(1e-3, rel=1e-3)
    assert report["outputs"]["label"]["passed"]


def test_check_runtime_rejects_shape_mismatch_and_missing_outputs() -> None:
    runtime, feeds, module = _runtime_and_feeds()
    reference = torch_reference(module, ["x"], ["y", "label"])
    with pytest.raises(ParityError, match="'y' on feed 0"):
        check_runtime(runtime, lambda f: {**reference(f), "y": reference(f)["y"][:, :2]}, feeds, Tolerance(1))
    with pytest.raises(ParityError, match="missing"):
        check_runtime(runtime, lambda f: {**reference(f), "z": reference(f)["y"]}, feeds, Tolerance(1))
    with pytest.raises(ParityError, match="at least one feed"):
        check_runtime(runtime, reference, [], Tolerance(1))


def test_compare_arrays_semantics() -> None:
    tol = Tolerance(atol=0.1, rtol=0.01)
    expected = np.array([1.0, 100.0, 0.0], np.float32)
    assert compare_arrays(expected + np.array([0.1, 1.0, 0.0], np.float32), expected, tol)["passed"]
    report = compare_arrays(expected + np.array([0.0, 1.2, 0.0], np.float32), expected, tol)
    assert not report["passed"] and report["violations"] == 1
    assert not compare_arrays(np.array([np.nan, 100.0, 0.0], np.float32), expected, tol)["passed"]
    assert not compare_arrays(np.array([1, 2]), np.array([1, 3]), Tolerance(10))["passed"]  # ints are exact
    assert compare_arrays(np.zeros((2, 0)), np.zeros((2, 0)), tol)["passed"]  # empty caches compare fine
    with pytest.raises(ParityError, match="shape"):
        compare_arrays(np.zeros(3), np.zeros(4), tol)
