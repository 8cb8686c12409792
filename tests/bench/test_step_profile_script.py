"""``benchmarks/step_profile.py`` (node kinds, profile aggregation) and ``benchmarks/step_layouts.py`` (the per-layer
cache layout computes the stacked layout's step exactly, and the model gets its class back)."""

from __future__ import annotations

import pytest
import torch
from onnx import TensorProto, helper

from edgecap.models import create_model
from tests.scripts import load_script

profile = load_script("step_profile")
layouts = load_script("step_layouts")


def test_a_matmul_is_linear_with_a_weight_and_attention_between_activations() -> None:
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
            helper.make_node("MatMul", ["h", "k"], ["s"], name="scores"),
            helper.make_node("Concat", ["s", "s"], ["c"], name="cat", axis=0),
            helper.make_node("Add", ["c", "c"], ["y"], name="add"),
            helper.make_node("TopK", ["y", "n"], ["v", "i"], name="topk"),
        ],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "k")],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, None)],
        [
            helper.make_tensor("w", TensorProto.FLOAT, [1, 1], [1.0]),
            helper.make_tensor("n", TensorProto.INT64, [1], [1]),
        ],
    )
    kinds = profile.node_kinds(helper.make_model(graph))
    assert kinds == {"proj": "linear", "scores": "attention", "cat": "copy", "add": "elementwise", "topk": "other"}


def _event(node: str, op: str, dur: float) -> dict:
    return {"cat": "Node", "name": f"{node}_kernel_time", "dur": dur, "args": {"op_name": op}}


def test_each_node_counts_with_its_median_over_runs() -> None:
    events = [
        _event("proj", "MatMul", 10),
        _event("proj", "MatMul", 12),
        _event("proj", "MatMul", 900),  # a run preempted by another process
        _event("cat", "Concat", 4),
        _event("cat", "Concat", 4),
        _event("cat", "Concat", 4),
        _event("late", "Split", 2),  # not in the optimised graph's names: classified by its op type
        {"cat": "Session", "name": "model_run", "dur": 5000},
        {"cat": "Node", "name": "proj_fence_before", "dur": 1},
    ]
    out = profile.aggregate_profile(events, {"proj": "linear", "cat": "copy"})
    assert out["kinds"] == {"linear": 12.0, "attention": 0.0, "copy": 6.0, "elementwise": 0.0, "other": 0.0}
    assert out["ops"] == {"MatMul": 12.0, "Concat": 4.0, "Split": 2.0}
    assert profile.shares(out["kinds"])["copy"] == pytest.approx(100 * 6 / 18)
    assert set(profile.shares({"a": 0.0}).values()) == {0.0}


def test_a_cache_length_outside_the_forced_steps_is_refused() -> None:
    with pytest.raises(SystemExit):
        profile.parse_args(["--steps", "10", "--past", "10"])
    assert profile.parse_args(["--past", "3"]).batch == [1, 16]


@pytest.mark.parametrize("name", ["acort-test", "ort-test", "acort-test-len"])
def test_the_per_layer_layout_computes_the_same_step(name: str) -> None:
    torch.manual_seed(0)
    model = create_model(name, vocab_size=40, radix_base=37).eval()
    memory = model.encode_memory(torch.randn(2, 5, model.feature_dim), torch.rand(2, 5, 4), None)
    level = (torch.tensor([1, 2]),) if getattr(model, "length_levels", None) else ()
    tokens = torch.tensor([3, 7])
    stacked_names = model.state_names
    with torch.no_grad():
        stacked = model.start(memory, None, *level)
        logprobs = []
        for _ in range(3):
            out, stacked = model.step(tokens, stacked)
            logprobs.append(out)
        with layouts.layout(model, "per-layer") as per_layer:
            assert not {"self_k", "self_v"} & set(per_layer.state_names)
            assert {"self_k0", "self_k1"} <= set(per_layer.state_names)
            state = per_layer.start(memory, None, *level)
            for expected in logprobs:
                out, state = per_layer.step(tokens, state)
                torch.testing.assert_close(out, expected, rtol=0, atol=0)
        for i in range(len(model.decoder.layers)):
            torch.testing.assert_close(state[f"self_k{i}"], stacked["self_k"][:, i], rtol=0, atol=0)
    assert type(model).__name__ == "ORTCaptioner" and model.state_names == stacked_names


def test_an_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown layout"), layouts.layout(torch.nn.Linear(1, 1), "ring"):
        pass
