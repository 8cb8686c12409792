"""The ONNX Runtime thread policy (``edgecap.runtimes.threads``): its decisions, explicit values winning, and the
settings reaching a real session's ``SessionOptions``."""

from __future__ import annotations

import pytest

from edgecap.runtimes.onnxruntime_session import OrtRuntime
from edgecap.runtimes.threads import (
    LARGE_STEP_BYTES,
    SPIN_KEYS,
    ThreadSettingError,
    check_threads,
    plan_threads,
    usable_cores,
)
from tests.export.helpers import TEST_CONFIGS, exported

SMALL, LARGE = LARGE_STEP_BYTES // 4, 2 * LARGE_STEP_BYTES


@pytest.mark.parametrize(
    ("threads", "streams", "cores", "step_bytes", "intra", "spin", "policy"),
    [
        ("auto", 1, 2, SMALL, 1, False, "auto"),
        ("auto", 1, 16, LARGE, 1, False, "auto"),  # auto never assumes the cores are free
        (None, 4, 8, SMALL, 1, False, "auto"),  # None = auto; one thread per stream
        ("dedicated", 1, 8, SMALL, 1, False, "dedicated"),  # a small step gains nothing from more threads
        ("dedicated", 1, 8, None, 1, False, "dedicated"),  # unknown size: treated as small
        ("dedicated", 1, 8, LARGE, 8, True, "dedicated"),
        ("dedicated", 3, 8, LARGE, 2, True, "dedicated"),  # cores shared out among the streams
        ("dedicated", 8, 4, LARGE, 1, False, "dedicated"),  # more streams than cores: one each, no spinning
        ("dedicated", 1, 1, LARGE, 1, False, "dedicated"),
        (3, 1, 2, SMALL, 3, False, "explicit"),
        (0, 1, 2, SMALL, 0, None, "ort-default"),  # ORT's own defaults: nothing set
    ],
)
def test_policy_decisions(threads, streams, cores, step_bytes, intra, spin, policy) -> None:
    plan = plan_threads(threads, streams=streams, cores=cores, step_bytes=step_bytes)
    assert (plan.intra_op, plan.spin, plan.policy) == (intra, spin, policy)
    assert plan.execution_mode == "sequential" and plan.reason
    assert plan.inter_op == (0 if policy == "ort-default" else 1)


@pytest.mark.parametrize("threads", ["auto", "dedicated", 1, 4, 0])
@pytest.mark.parametrize("spin", [True, False])
def test_an_explicit_spin_always_wins(threads, spin) -> None:
    plan = plan_threads(threads, spin, cores=8, step_bytes=LARGE)
    assert plan.spin is spin
    assert plan.session_config() == dict.fromkeys(SPIN_KEYS, "1" if spin else "0")


def test_an_explicit_count_wins_over_the_facts() -> None:
    for cores, size in ((1, SMALL), (64, LARGE)):
        assert plan_threads(5, cores=cores, step_bytes=size, streams=9).intra_op == 5


def test_runtime_options_and_record() -> None:
    plan = plan_threads("auto", streams=3)
    assert plan.runtime_options() == {
        "intra_op_threads": 1,
        "inter_op_threads": 1,
        "execution_mode": "sequential",
        "session_config": dict.fromkeys(SPIN_KEYS, "0"),
    }
    record = plan.as_dict()
    assert (record["intra_op"], record["spin"], record["policy"]) == (1, False, "auto")
    assert plan.describe() == "1 thread, no spinning"
    ort_default = plan_threads(0)
    assert ort_default.session_config() == {} and ort_default.describe() == "ORT's default threads, ORT's spinning"


@pytest.mark.parametrize(
    ("threads", "spin"), [(-1, None), ("many", None), (True, None), (1.5, None), ("auto", "yes"), (1, 0)]
)
def test_bad_values_are_refused(threads, spin) -> None:
    with pytest.raises(ThreadSettingError):
        check_threads(threads, spin)
    with pytest.raises(ThreadSettingError):
        plan_threads(threads, spin)


@pytest.mark.parametrize("streams", [0, -2, True, 1.0])
def test_bad_stream_counts_are_refused(streams) -> None:
    with pytest.raises(ThreadSettingError, match="streams"):
        plan_threads("auto", streams=streams)


def test_usable_cores_from_affinity_physical_and_logical() -> None:
    def affinity(cpus):
        return lambda pid: set(range(cpus))

    def broken(pid):
        raise OSError("no affinity here")

    assert usable_cores(affinity(1), lambda: 8, lambda: 16) == 1  # pinned to one CPU (taskset)
    assert usable_cores(affinity(16), lambda: 8, lambda: 16) == 8  # hyper-threads are not cores
    assert usable_cores(broken, lambda: None, lambda: 6) == 6
    assert usable_cores(broken, lambda: None, lambda: None) == 1
    assert usable_cores() >= 1


@pytest.mark.parametrize("threads", ["auto", 2, 0])
def test_session_options_carry_the_plan(threads) -> None:
    plan = plan_threads(threads, True if threads == 2 else None)
    runtime = OrtRuntime(exported(TEST_CONFIGS[0]).model("step"), providers=["cpu"], **plan.runtime_options())
    with runtime:
        settings = runtime.session_settings
        options = runtime.session.get_session_options()
    assert settings["intra_op_threads"] == options.intra_op_num_threads == plan.intra_op
    assert settings["inter_op_threads"] == plan.inter_op and settings["execution_mode"] == "sequential"
    expected = None if plan.spin is None else ("1" if plan.spin else "0")
    assert [settings[key] for key in SPIN_KEYS] == [expected, expected]


@pytest.mark.parametrize(("threads", "spin", "intra"), [("auto", False, 0), (2, True, 2), (None, None, 0)])
def test_on_a_gpu_provider_explicit_values_still_reach_the_session(threads, spin, intra) -> None:
    from edgecap.runtimes.onnxruntime_session import _thread_options
    from edgecap.runtimes.registry import LoadRequest

    plan, options = _thread_options(LoadRequest(threads=threads, spin=spin), "CUDAExecutionProvider", {})
    assert plan is None  # the policy only runs on CPU
    runtime = OrtRuntime(exported(TEST_CONFIGS[0]).model("step"), providers=["cpu"], **options)
    with runtime:
        settings = runtime.session_settings
    assert settings["intra_op_threads"] == intra
    expected = None if spin is None else ("1" if spin else "0")
    assert [settings[key] for key in SPIN_KEYS] == [expected, expected]
