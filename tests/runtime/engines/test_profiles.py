"""Optimisation profiles from every family's export spec: rows = batch × beam for the step, images for the encoder
and LaBERT's refine, the cache from empty to the longest caption, regions and caption length from the manifest."""

from __future__ import annotations

import pytest

from edgecap.runtime.backends.base import TensorMeta
from edgecap.runtime.engines.graphs import GraphIO
from edgecap.runtime.engines.profiles import ProfileError, ProfileRequest, dim_ranges, eval_dim, graph_profile

REQUEST = ProfileRequest(max_batch=8, beam=3, max_regions=50)


@pytest.mark.parametrize("family", ["ort-test", "expansionnet-test"])
def test_autoregressive_profiles(family_graphs, family: str) -> None:
    graphs = family_graphs[family]
    max_past = graphs["max_len"] - 1
    assert graphs["dims"]["past"] == {"min": 0, "max": max_past}
    encoder = graph_profile("encoder", graphs["io"]["encoder"], graphs["dims"], REQUEST)
    assert encoder.shapes["features"] == ((1, 1, 24), (8, 50, 24), (8, 50, 24))  # images, regions 1..50
    assert encoder.shapes["feature_mask"] == ((1, 1), (8, 50), (8, 50))
    step = graph_profile("step", graphs["io"]["step"], graphs["dims"], REQUEST)
    assert step.shapes["tokens"] == ((1,), (24,), (24,))  # 8 images × beam 3
    expected = {"batch": (1, 24, 24), "regions": (1, 50, 50), "past": (0, max_past // 2, max_past)}
    image_states = [n for n in graphs["state_names"] if graphs["io"]["step"].input(n).shape[0] == "images"]
    if image_states:  # TensorRT gathers the image states once per hypothesis: the step's rows
        expected["images"] = (1, 24, 24)
        assert all(step.shapes[n][0][0] == 1 and step.shapes[n][2][0] == 24 for n in image_states)
    assert step.dims == expected
    assert set(step.shapes) == {"tokens", *graphs["state_names"]}
    for name in graphs["updated"]:  # every cache: empty at the first step, the longest caption minus one at most
        low, _, high = step.shapes[name]
        shape = graphs["io"]["step"].input(name).shape
        axes = [i for i, d in enumerate(shape) if d == "past"]
        assert axes and all(low[a] == 0 and high[a] == max_past for a in axes), (name, shape)
        assert low[0] == 1 and high[0] == 24


def test_expansionnet_square_cache_shares_one_range(family_graphs) -> None:
    graphs = family_graphs["expansionnet-test"]
    step = graph_profile("step", graphs["io"]["step"], graphs["dims"], REQUEST)
    name = next(n for n in graphs["state_names"] if graphs["io"]["step"].input(n).shape.count("past") == 2)
    low, opt, high = step.shapes[name]
    past = graphs["max_len"] - 1
    assert (low[1], low[3]) == (0, 0) and (high[1], high[3]) == (past, past) and opt[1] == opt[3] == past // 2


def test_labert_profiles(family_graphs) -> None:
    graphs = family_graphs["labert-test"]
    assert graphs["roles"] == {"encoder": "encoder", "refine": "refine"}
    refine = graph_profile("refine", graphs["io"]["refine"], graphs["dims"], REQUEST)
    high_len = graphs["dims"]["length"]["max"]
    assert refine.shapes["tokens"] == ((1, 1), (8, high_len), (8, high_len))  # one caption per image, no beam
    assert refine.shapes["length_level"] == ((1,), (8,), (8,))
    assert refine.shapes["visual"][2] == (8, 50, 32)
    assert "past" not in refine.dims


def test_pixels_in_bundle_has_fixed_regions(tmp_path) -> None:
    io = GraphIO((TensorMeta("pixel_values", "float32", ("batch", 3, 64, 64)),), ())
    dims = {"batch": {"min": 1, "max": 1024}, "past": {"min": 0, "max": 20}, "regions": {"min": 4, "max": 4}}
    profile = graph_profile("encoder", io, dims, ProfileRequest(max_batch=2, beam=3))
    assert profile.shapes == {"pixel_values": ((1, 3, 64, 64), (2, 3, 64, 64), (2, 3, 64, 64))}
    assert dim_ranges(dims, "step", ProfileRequest(max_batch=2, beam=3))["regions"] == (4, 4, 4)


def test_requests_beyond_the_export_and_undeclared_dims_are_refused() -> None:
    dims = {"batch": {"min": 1, "max": 64}, "past": {"min": 0, "max": 20}}
    with pytest.raises(ProfileError, match="72 rows .* exceed the 64 rows"):
        dim_ranges(dims, "step", ProfileRequest(max_batch=24, beam=3))
    assert dim_ranges(dims, "encoder", ProfileRequest(max_batch=24, beam=3))["batch"] == (1, 24, 24)
    io = GraphIO((TensorMeta("x", "float32", ("batch", "frames")),), ())
    with pytest.raises(ProfileError, match=r"'frames'.*does not declare"):
        graph_profile("encoder", io, dims, ProfileRequest())
    with pytest.raises(ProfileError, match="max_batch"):
        ProfileRequest(max_batch=0)


def test_profile_digest_changes_with_the_shapes(family_graphs) -> None:
    graphs = family_graphs["ort-test"]
    a = graph_profile("step", graphs["io"]["step"], graphs["dims"], REQUEST)
    b = graph_profile("step", graphs["io"]["step"], graphs["dims"], ProfileRequest(max_batch=8, beam=4, max_regions=50))
    assert a.digest() == graph_profile("step", graphs["io"]["step"], graphs["dims"], REQUEST).digest()
    assert a.digest() != b.digest()


def test_eval_dim() -> None:
    assert eval_dim("past + 1", {"past": 5}) == 6 and eval_dim("batch", {"batch": 3}) == 3 and eval_dim(7, {}) == 7
    assert eval_dim("past - 1", {"past": 5}) == 4
    with pytest.raises(ProfileError, match="does not declare"):
        eval_dim("s0 + 1", {"past": 5})
    with pytest.raises(ProfileError, match="not a sum"):
        eval_dim("past * 2", {"past": 5})
