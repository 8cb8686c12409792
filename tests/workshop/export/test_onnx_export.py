"""Spec-driven ONNX export: graph interfaces, dynamic axes, portability (no If / com.microsoft), metadata, files."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from edgecap._version import __version__
from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeSession
from edgecap.workshop.export import (
    DimSpec,
    ExportSpec,
    ExportSpecError,
    Fp16Policy,
    GraphSpec,
    Tolerance,
    get_export_spec,
    list_export_families,
)
from edgecap.workshop.export.graph import GraphError, compose_models, non_portable_nodes
from edgecap.workshop.export.onnx import ExportError, export_onnx
from tests.workshop.export.helpers import AR_TEST_CONFIGS, TEST_CONFIGS, exported, exported_with_backbone, tiny_model

PRECISIONS = ("fp32", "fp16")


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.mark.parametrize("config", TEST_CONFIGS)
def test_every_graph_is_portable_to_tensorrt(config: str) -> None:
    """No control flow and nothing outside the standard ONNX domain, at every precision (walks every node)."""
    result = exported(config)
    for (graph, precision), entry in result.graphs.items():
        model = entry.model
        for node in model.graph.node:
            assert node.op_type not in ("If", "Loop", "Scan"), (graph, precision, node.name)
            assert node.domain in ("", "ai.onnx"), (graph, precision, node.domain, node.op_type)
            assert not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
        assert all(imp.domain in ("", "ai.onnx") for imp in model.opset_import), model.opset_import
        assert not model.functions
        assert non_portable_nodes(model) == []


def test_non_portable_nodes_finds_control_flow_and_contrib_ops() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "b", [], [y])
    nodes = [
        helper.make_node("FusedGemm", ["x", "x"], ["g"], domain="com.microsoft", name="fused"),
        helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch, name="merged"),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]))
    found = non_portable_nodes(model)
    assert any("com.microsoft::FusedGemm" in f for f in found) and any("If" in f for f in found)


@pytest.mark.parametrize("config", AR_TEST_CONFIGS)
def test_step_graph_interface(config: str) -> None:
    result = exported(config)
    model = tiny_model(config)
    names = result.spec.state_names  # the model's own, or one cache per decoder position (ORT/ACORT's export)
    step = result.model("step")
    inputs = {vi.name: vi for vi in step.graph.input}
    outputs = {vi.name: vi for vi in step.graph.output}
    assert list(inputs) == ["tokens", *names]
    caches = tuple(n for n in names if "past" in _dims(inputs[n]))  # growing caches (attention families)
    updated = result.spec.step_state_names
    assert updated and all(_dims(inputs[n])[0] == "batch" for n in updated)
    assert set(caches) <= set(updated)  # only what a step changes is an output
    # every family but the recurrent one (Image Transformer: a fixed-size LSTM state) has a growing cache
    assert caches if "lstm_h" not in names else updated == ("lstm_h", "lstm_c", "context")
    caches = updated
    assert list(outputs) == ["logprobs", *(f"{n}_out" for n in caches)]
    assert inputs["tokens"].type.tensor_type.elem_type == TensorProto.INT64
    assert _dims(inputs["tokens"]) == ["batch"]
    assert _dims(outputs["logprobs"]) == ["batch", model.vocab_size]
    if "self_k0" in inputs:  # ORT/ACORT: one (B, H, past, d_k) cache per decoder position
        assert set(names) - set(model.state_names) == {n for n in names if n.startswith(("self_k", "self_v"))}
        assert _dims(inputs["self_k0"])[2] == "past"
    # the image states (cross-attention keys, memory bias) take one row per image or per hypothesis: dim "images"
    image_states = set(model.image_state_names)
    assert all(_dims(inputs[n])[0] == ("images" if n in image_states else "batch") for n in names)
    leading = "images" if "memory_bias" in image_states else "batch"
    assert _dims(inputs["memory_bias"]) == [leading, 1, 1, "regions"]
    init = result.model("init")
    level_input = ["length_level"] if model.length_levels else []
    assert [vi.name for vi in init.graph.input] == ["features", "boxes", "feature_mask", *level_input]
    assert [vi.name for vi in init.graph.output] == list(names)
    assert init.graph.input[2].type.tensor_type.elem_type == TensorProto.BOOL


def test_step_runs_with_empty_and_grown_cache() -> None:
    """One step at cache length 0 and then several more, feeding outputs back, against torch's own steps."""
    config = TEST_CONFIGS[0]
    model, result = tiny_model(config), exported(config)
    g = torch.Generator().manual_seed(3)
    features, mask = torch.randn(2, 6, 16, generator=g), torch.ones(2, 6, dtype=torch.bool)
    boxes = torch.tensor([[0.1, 0.1, 0.5, 0.6]]).repeat(2, 6, 1) + torch.rand(2, 6, 1, generator=g) * 0.3
    with torch.no_grad():
        state = model.encode(features, boxes, mask)
    with OnnxRuntimeSession(result.model("init")) as init, OnnxRuntimeSession(result.model("step")) as step:
        onnxruntime_state = init.infer(
            {"features": features.numpy(), "boxes": boxes.numpy(), "feature_mask": mask.numpy()}
        )
        positions = state["self_k"].shape[1]  # the model's stacked cache; the graph has one per decoder position
        assert onnxruntime_state["self_k0"].shape[2] == 0
        for t in range(4):
            tokens = torch.tensor([3 + t, 5])
            with torch.no_grad():
                logprobs, state = model.step(tokens, state)
            out = step.infer({"tokens": tokens.numpy(), **{n: onnxruntime_state[n] for n in result.spec.state_names}})
            onnxruntime_state = {**onnxruntime_state, **{n: out[f"{n}_out"] for n in result.spec.step_state_names}}
            assert onnxruntime_state["self_k0"].shape[2] == t + 1
            np.testing.assert_allclose(out["logprobs"], logprobs.numpy(), atol=1e-4)
            for i in range(positions):
                np.testing.assert_allclose(onnxruntime_state[f"self_k{i}"], state["self_k"][:, i].numpy(), atol=1e-4)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_metadata_is_recorded(precision: str) -> None:
    config = TEST_CONFIGS[0]
    for graph in ("encoder", "start", "init", "step"):
        model = exported(config).model(graph, precision)
        meta = {p.key: p.value for p in model.metadata_props}
        opset = next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))
        assert meta["opset"] == str(opset) == "20"
        assert meta["edgecap_version"] == __version__
        assert meta["model_name"] == config
        assert meta["precision"] == precision
        assert meta["graph_role"] == graph
        assert meta["state_names"] == ",".join(exported(config).spec.state_names)
        assert model.producer_name == "edgecap"


def test_backbone_encoder_takes_pixels() -> None:
    result = exported_with_backbone()
    init = result.model("init")
    (pixels,) = init.graph.input
    assert pixels.name == "pixel_values" and _dims(pixels) == ["batch", 3, 64, 64]
    meta = {p.key: p.value for p in init.metadata_props}
    assert meta["backbone"] == "test_resnet" and meta["image_size"] == "64"
    assert result.spec.dims["regions"].min == result.spec.dims["regions"].max == 4  # 64 px / 32 -> 2 x 2 cells


def test_export_writes_files_and_report(tmp_path) -> None:
    model = tiny_model(TEST_CONFIGS[0])
    result = export_onnx(model, tmp_path, name="tiny", graphs=["start"], precisions=("fp16",))
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.onnx")) == [
        "fp16/start.onnx",
        "fp32/start.onnx",
    ]
    assert result.get("start", "fp16").path == tmp_path / "fp16" / "start.onnx"
    assert not list(tmp_path.rglob("*.tmp"))
    report = json.loads((tmp_path / "export_report.json").read_text())
    assert report["model_name"] == "tiny" and report["parity_passed"] is True
    assert {(g["graph"], g["precision"]) for g in report["graphs"]} == {("start", "fp32"), ("start", "fp16")}
    entry = report["graphs"][0]
    assert entry["bytes"] == (tmp_path / "fp32" / "start.onnx").stat().st_size and len(entry["sha256"]) == 64
    assert entry["parity"]["passed"] and "max_abs" in entry["parity"]["outputs"]["cross_k"]
    onnx.checker.check_model(str(tmp_path / "fp16" / "start.onnx"))
    with pytest.raises(FileExistsError, match="overwrite"):
        export_onnx(model, tmp_path, graphs=["start"])
    again = export_onnx(
        model, tmp_path, graphs=["start"], precisions=("fp32",), simplify="onnxruntime", parity=False, overwrite=True
    )
    assert again.get("start").parity is None and again.parity_passed is None
    assert non_portable_nodes(again.model("start")) == []  # ONNX Runtime's *basic* optimiser adds no contrib ops


def test_export_rejects_bad_requests() -> None:
    model = tiny_model(TEST_CONFIGS[0])
    with pytest.raises(ExportError, match="precision"):
        export_onnx(model, precisions=("int4",))
    with pytest.raises(ExportError, match="simplifier"):
        export_onnx(model, graphs=["start"], simplify="magic", parity=False)
    with pytest.raises(ExportSpecError, match="no graph"):
        export_onnx(model, graphs=["decoder"])
    with pytest.raises(ExportError, match="model or a spec"):
        export_onnx()


# -- the spec ------------------------------------------------------------------------------------------------------
def test_spec_lookup_is_a_registry() -> None:
    assert "ort" in list_export_families()
    spec = get_export_spec(tiny_model(TEST_CONFIGS[0]), name="x")
    assert spec.graph_names == ("encoder", "start", "init", "step")
    assert spec.runtime_graphs == {"encoder": "init", "step": "step"}
    assert all(d.example >= 2 for d in spec.dims.values() if d.is_dynamic)
    assert spec.dims["past"].min == 0

    class Unknown(torch.nn.Module):
        cfg = type("Cfg", (), {"family": "nope"})()

    with pytest.raises(ExportSpecError, match="unknown model family 'nope'"):
        get_export_spec(Unknown())


def _graph(**kw: object) -> GraphSpec:
    base = dict(
        name="g",
        module=torch.nn.Identity(),
        inputs=("x",),
        outputs=("y",),
        dynamic_axes={"x": {0: "batch"}},
        make_inputs=lambda sizes, g: {"x": torch.zeros(sizes["batch"])},
        tolerances={"fp32": Tolerance(1e-5), "fp16": Tolerance(1e-2)},
    )
    return GraphSpec(**{**base, **kw})


def _spec(*graphs: GraphSpec, **kw: object) -> ExportSpec:
    base = dict(
        name="toy",
        graphs=graphs,
        dims={"batch": DimSpec("batch", 1, 8, 2)},
        parity_sizes=({"batch": 1},),
        runtime_graphs={},
    )
    return ExportSpec(**{**base, **kw})


def test_spec_validation_names_the_problem() -> None:
    with pytest.raises(ExportSpecError, match="specialised"):
        DimSpec("batch", 1, 8, 1)  # a size-1 example would be baked into the graph
    with pytest.raises(ExportSpecError, match="outside"):
        DimSpec("batch", 1, 8, 9)
    with pytest.raises(ExportSpecError, match="atol"):
        Tolerance(atol=-1)
    with pytest.raises(ExportSpecError, match="undeclared dim 'time'"):
        _spec(_graph(dynamic_axes={"x": {0: "time"}}))
    with pytest.raises(ExportSpecError, match="not an earlier graph"):
        _spec(_graph(compose=("encoder",)))
    with pytest.raises(ExportSpecError, match="no tolerance for precision 'fp16'"):
        _spec(_graph(tolerances={"fp32": Tolerance(1e-5)}))
    with pytest.raises(ExportSpecError, match="both inputs and outputs"):
        _spec(_graph(outputs=("x",)))
    with pytest.raises(ExportSpecError, match="duplicate"):
        _spec(_graph(), _graph())
    with pytest.raises(ExportSpecError, match="unknown graph"):
        _spec(_graph(), runtime_graphs={"step": "missing"})
    with pytest.raises(ExportSpecError, match="outside"):
        _spec(_graph(), parity_sizes=({"batch": 9},))
    spec = _spec(_graph(output_tolerances={"fp16": {"y": Tolerance(0.5)}}))
    assert spec.graph("g").tolerance("fp16", "y").atol == 0.5 and spec.graph("g").tolerance("fp32", "y").atol == 1e-5
    assert spec.replace(opset=18).opset == 18 and isinstance(Fp16Policy().cone_stops, tuple)


def test_compose_models_wires_by_name_and_rejects_unbound_inputs() -> None:
    def model(nodes, inputs, outputs):
        vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch"]) for n in inputs]
        vo = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch"]) for n in outputs]
        one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])  # same initializer name in both parts
        graph = helper.make_graph(nodes, "g", vi, vo, initializer=[one])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])

    first = model([helper.make_node("Add", ["x", "one"], ["h"], name="add")], ["x"], ["h"])
    second = model(
        [helper.make_node("Mul", ["h", "x"], ["t"]), helper.make_node("Add", ["t", "one"], ["y"])], ["h", "x"], ["y"]
    )
    composite = compose_models([("a", first), ("b", second)], ["x"], ["y"], "toy")
    onnx.checker.check_model(composite, full_check=True)
    with OnnxRuntimeSession(composite) as rt:
        x = np.array([1.0, 2.0], np.float32)
        np.testing.assert_allclose(rt.infer({"x": x})["y"], (x + 1) * x + 1)
    with pytest.raises(GraphError, match="neither composite inputs nor earlier outputs"):
        compose_models([("b", second)], ["x"], ["y"], "toy")
    with pytest.raises(GraphError, match="not produced"):
        compose_models([("a", first)], ["x"], ["y"], "toy")
