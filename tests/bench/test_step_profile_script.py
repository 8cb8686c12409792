"""``benchmarks/step_profile.py``: node kinds from the optimised graph, each node's median over runs, arguments."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from tests.scripts import load_script

profile = load_script("step_profile")


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


def test_each_node_counts_with_its_median_over_the_runs_after_the_first() -> None:
    events = [
        _event("proj", "MatMul", 500),  # the first run: allocations, cold caches
        _event("proj", "MatMul", 10),
        _event("proj", "MatMul", 12),
        _event("proj", "MatMul", 900),  # a run preempted by another process
        _event("cat", "Concat", 40),
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


def test_profiling_a_beam_step_feeds_a_token_per_hypothesis_with_image_states_once_per_image(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """After a beam expansion the image states (cross-attention keys, memory bias) keep one row per image; the
    profiled step still gets one token per hypothesis, not per image."""
    import numpy as np

    from edgecap.runtimes.onnxruntime_session import create_ort_step_model

    setup = profile.random_setup("acort-test", 2, 0)
    paths = {}
    for role, graph in profile.export_layout(setup.model, "per-layer").items():
        paths[role] = tmp_path / f"{role}.onnx"
        paths[role].write_bytes(graph.SerializeToString())
    with create_ort_step_model(paths["encoder"], paths["step"], intra_op_threads=1) as step_model:
        state = step_model.select(step_model.encode(setup.batches[0]), np.repeat(np.arange(2), 3))
        assert step_model.image_states and all(state[n].shape[0] == 2 for n in step_model.image_states)
        state = {k: np.ascontiguousarray(v) for k, v in state.items()}
        out = profile.profile_step(paths["step"], state, [0, 2], threads=1, runs=2)
    assert sorted(out) == [0, 2]
    assert all(out[past]["kinds"]["linear"] > 0 for past in out)
