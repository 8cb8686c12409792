"""The device buffers of one batch shape: every state twice at its largest shape (ping-pong), sized by hand here."""

from __future__ import annotations

import numpy as np

from edgecap.runtime.backends.base import TensorMeta
from edgecap.runtime.engines.buffers import BufferSpec, plan_buffers
from edgecap.runtime.engines.graphs import GraphIO
from edgecap.runtime.engines.profiles import ProfileRequest, graph_profile


def test_ort_step_plan_bytes(family_graphs) -> None:
    graphs = family_graphs["ort-test"]
    request = ProfileRequest(max_batch=4, beam=3, max_regions=50)
    step = graph_profile("step", graphs["io"]["step"], graphs["dims"], request)
    dims = {n: r[2] for n, r in step.dims.items() if n != "batch"}
    plan = plan_buffers(graphs["io"]["encoder"], graphs["io"]["step"], "step", graphs["state_names"], dims, 4, 3)
    past = graphs["max_len"]  # the longest cache the step writes: max past + 1
    rows = 12
    expected = {
        "features": ((4, 50, 24), "float32", 1),
        "boxes": ((4, 50, 4), "float32", 1),
        "feature_mask": ((4, 50), "bool", 1),
        "memory_bias": ((rows, 1, 1, 50), "float32", 2),
        "cross_k": ((rows, 2, 2, 50, 16), "float32", 2),
        "cross_v": ((rows, 2, 2, 50, 16), "float32", 2),
        # one cache per decoder position (the export's per-layer layout), each (rows, heads, past, d_k)
        "self_k0": ((rows, 2, past, 16), "float32", 2),
        "self_k1": ((rows, 2, past, 16), "float32", 2),
        "self_v0": ((rows, 2, past, 16), "float32", 2),
        "self_v1": ((rows, 2, past, 16), "float32", 2),
        "tokens": ((rows,), "int64", 1),
        "logprobs": ((rows, 40), "float32", 1),
        "index": ((rows,), "int32", 1),
    }
    got = {b.name: (b.shape, b.dtype, b.copies) for b in plan.buffers}
    assert got == expected
    total = sum(int(np.prod(s)) * np.dtype(d).itemsize * c for s, d, c in expected.values())
    assert plan.total_bytes == total
    assert plan["self_k0"].total_bytes == 2 * rows * 2 * past * 16 * 4
    assert {r["name"]: r["bytes"] for r in plan.rows()}["cross_k"] == 2 * rows * 2 * 2 * 50 * 16 * 4


def test_refine_plan_has_one_copy_and_no_index(family_graphs) -> None:
    graphs = family_graphs["labert-test"]
    request = ProfileRequest(max_batch=2, beam=3, max_regions=10)
    refine = graph_profile("refine", graphs["io"]["refine"], graphs["dims"], request)
    dims = {n: r[2] for n, r in refine.dims.items() if n != "batch"}
    plan = plan_buffers(graphs["io"]["encoder"], graphs["io"]["refine"], "refine", graphs["state_names"], dims, 2, 1)
    length = graphs["dims"]["length"]["max"]
    assert plan["logprobs"].shape == (2, length, 40) and plan["tokens"].shape == (2, length)
    assert all(b.copies == 1 for b in plan.buffers) and "index" not in [b.name for b in plan.buffers]
    assert plan["visual"].shape == (2, 10, 32)


def test_buffer_spec_bytes() -> None:
    assert BufferSpec("x", (3, 0, 5), "float16", 2).total_bytes == 0  # an empty cache at the first step
    assert BufferSpec("x", (3, 4), "float16", 2).total_bytes == 48
    io = GraphIO((TensorMeta("pixel_values", "float32", ("batch", 3, 8, 8)),), ())
    loop = GraphIO(
        (TensorMeta("tokens", "int32", ("batch",)), TensorMeta("c", "float16", ("batch", "past"))),
        (TensorMeta("logprobs", "float32", ("batch", 7)), TensorMeta("c_out", "float16", ("batch", "past + 1"))),
    )
    plan = plan_buffers(io, loop, "step", ("c",), {"past": 9}, images=2, beam=4)
    assert plan["pixel_values"].shape == (2, 3, 8, 8) and plan["c"].shape == (8, 10) and plan["c"].copies == 2
    assert plan.total_bytes == 2 * 3 * 64 * 4 + 2 * 8 * 10 * 2 + 8 * 4 + 8 * 7 * 4 + 8 * 4
