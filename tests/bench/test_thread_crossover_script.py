"""``benchmarks/thread_crossover.py``: the threshold rule and one timed pair of sessions on a tiny graph."""

from __future__ import annotations

import numpy as np

from edgecap.runtimes.onnxruntime_session import OrtRuntime
from edgecap.runtimes.threads import plan_threads
from tests.export.helpers import TEST_CONFIGS, exported
from tests.runtimes.test_onnxruntime_session import _step_feed
from tests.scripts import load_script

script = load_script("thread_crossover")


def test_the_threshold_is_where_the_wide_session_stays_faster() -> None:
    assert script.threshold([(3, 1.3), (6, 1.1), (12, 0.9), (24, 0.8), (48, 0.7)]) == 12
    assert script.threshold([(3, 0.9), (6, 1.1), (12, 0.9), (24, 0.8)]) == 12  # a win below a loss does not count
    assert script.threshold([(1, 0.8), (2, 0.7)]) == 1
    assert script.threshold([(3, 1.2), (48, 1.01)]) is None  # never faster: never wide
    assert script.threshold([]) is None


def test_a_pair_of_sessions_is_timed_in_turn() -> None:
    model = exported(TEST_CONFIGS[0]).model("step")
    feed = _step_feed(TEST_CONFIGS[0], batch=4)
    narrow = OrtRuntime(model, providers=["cpu"], **plan_threads(1).runtime_options())
    wide = OrtRuntime(model, providers=["cpu"], **plan_threads(2, False).runtime_options())
    with narrow, wide:
        times = script.time_pair(narrow, wide, feed, calls=2, repeats=2)
        assert narrow.inference_count == wide.inference_count == 2 * 3  # one warm-up sample, two timed
    assert set(times) == {"1", "wide"}
    assert all(t["wall_ms"] > 0 and t["cpu_ms"] >= 0 and np.isfinite(t["wall_ms"]) for t in times.values())


def test_arguments_default_to_the_documented_grid() -> None:
    args = script.parse_args([])
    assert (args.model, args.rows, args.batch, args.wide) == (["acort-xsmall"], [3, 6, 12, 24, 48], [1, 2, 4, 8, 16], 2)


def test_step_feeds_have_the_asked_rows_and_a_half_length_cache() -> None:
    from edgecap.export.spec import get_export_spec
    from edgecap.models import create_model, paper_settings

    spec = get_export_spec(create_model("acort-xsmall", **paper_settings("acort-xsmall")))
    feed = script.step_feed(spec, "acort-xsmall", 6, seed=0)
    regions, steps = script.PAPER_CASES["acort-xsmall"]
    assert set(feed) == set(spec.graph(spec.runtime_graphs["step"]).inputs)
    image_states = set(spec.state_names) & {"memory_bias", "cross_k", "cross_v"}
    assert image_states and all(feed[n].shape[0] == 2 for n in image_states)  # once per image of 3 beams
    assert all(value.shape[0] == 6 for name, value in feed.items() if name not in image_states)
    assert feed["self_k0"].shape[2] == steps // 2 and feed["memory_bias"].shape[-1] == regions
