"""The ONNX Runtime thread policy (``edgecap.runtime.backends.threads``): its decisions, explicit values winning, and
the
settings reaching a real session's ``SessionOptions``."""

from __future__ import annotations

import pytest

from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeSession
from edgecap.runtime.backends.threads import (
    LARGE_STEP_BYTES,
    SPIN_KEYS,
    WIDE_FROM_ROWS,
    ThreadPlan,
    ThreadSettingError,
    WidePlan,
    check_threads,
    plan_threads,
    usable_cores,
)
from tests.workshop.export.helpers import TEST_CONFIGS, exported

SMALL, LARGE = LARGE_STEP_BYTES // 4, 2 * LARGE_STEP_BYTES


@pytest.mark.parametrize(
    ("threads", "streams", "cores", "step_bytes", "intra", "spin", "policy", "wide"),
    [
        ("auto", 1, 2, SMALL, 1, False, "auto", 2),  # one thread, a 2-thread session for large calls
        ("auto", 1, 16, LARGE, 1, False, "auto", 16),  # every usable core, but only for calls of many rows
        ("auto", 1, 1, SMALL, 1, False, "auto", 0),  # one core: nothing to widen to
        (None, 4, 8, SMALL, 1, False, "auto", 2),  # None = auto; the cores divided among the streams
        ("auto", 3, 4, SMALL, 1, False, "auto", 0),  # fewer than 2 cores per stream: no wide session
        ("dedicated", 1, 8, SMALL, 1, False, "dedicated", 0),  # a small step gains nothing from more threads
        ("dedicated", 1, 8, None, 1, False, "dedicated", 0),  # unknown size: treated as small
        ("dedicated", 1, 8, LARGE, 8, True, "dedicated", 0),
        ("dedicated", 3, 8, LARGE, 2, True, "dedicated", 0),  # cores shared out among the streams
        ("dedicated", 8, 4, LARGE, 1, False, "dedicated", 0),  # more streams than cores: one each, no spinning
        ("dedicated", 1, 1, LARGE, 1, False, "dedicated", 0),
        (3, 1, 2, SMALL, 3, False, "explicit", 0),
        (1, 1, 8, SMALL, 1, False, "explicit", 0),  # an explicit count is exactly that, at every call size
        (0, 1, 2, SMALL, 0, None, "onnxruntime-default", 0),  # ONNX Runtime's own defaults: nothing set
    ],
)
def test_policy_decisions(threads, streams, cores, step_bytes, intra, spin, policy, wide) -> None:
    plan = plan_threads(threads, streams=streams, cores=cores, step_bytes=step_bytes)
    assert (plan.intra_op, plan.spin, plan.policy) == (intra, spin, policy)
    assert plan.execution_mode == "sequential" and plan.reason
    assert plan.inter_op == (0 if policy == "onnxruntime-default" else 1)
    assert (plan.wide.intra_op if plan.wide else 0) == wide
    if plan.wide:
        assert plan.wide.spin is False and dict(plan.wide.from_rows) == WIDE_FROM_ROWS
        assert "second session" in plan.reason


def test_the_wide_session_never_serves_a_batch_of_one() -> None:
    wide = plan_threads("auto", cores=2).wide
    assert wide is not None
    assert min(dict(wide.from_rows).values()) >= 2  # batch-1 users pay no memory or start-up for it
    assert wide.threshold("encoder") == WIDE_FROM_ROWS["encoder"] and wide.threshold("step") == WIDE_FROM_ROWS["step"]
    assert wide.threshold("refine") is None and wide.threshold(None) is None  # not measured: never wide


@pytest.mark.parametrize(
    ("intra", "rows"), [(1, {"step": 4}), (2, {"step": 0}), (True, {"step": 4}), (2, {"step": 2.5})]
)
def test_bad_wide_plans_are_refused(intra, rows) -> None:
    with pytest.raises(ThreadSettingError):
        WidePlan(intra, False, tuple(rows.items()))


@pytest.mark.parametrize("threads", ["auto", "dedicated", 1, 4, 0])
@pytest.mark.parametrize("spin", [True, False])
def test_an_explicit_spin_always_wins(threads, spin) -> None:
    plan = plan_threads(threads, spin, cores=8, step_bytes=LARGE)
    assert plan.spin is spin
    assert plan.session_config() == dict.fromkeys(SPIN_KEYS, "1" if spin else "0")
    if plan.wide is not None:  # the wide session too
        assert plan.wide.spin is spin and plan.wide.session_config() == plan.session_config()


def test_an_explicit_count_wins_over_the_facts() -> None:
    for cores, size in ((1, SMALL), (64, LARGE)):
        assert plan_threads(5, cores=cores, step_bytes=size, streams=9).intra_op == 5


def test_runtime_options_and_record() -> None:
    plan = plan_threads("auto", streams=3, cores=2)
    assert plan.runtime_options() == {
        "intra_op_threads": 1,
        "inter_op_threads": 1,
        "execution_mode": "sequential",
        "session_config": dict.fromkeys(SPIN_KEYS, "0"),
        "wide": None,
    }
    record = plan.as_dict()
    assert (record["intra_op"], record["spin"], record["policy"], record["wide"]) == (1, False, "auto", None)
    assert record["decode_workers"] == 1  # 2 cores / 3 streams: one decode per stream
    assert plan.describe() == "1 thread, no spinning"
    assert ThreadPlan.from_dict(record) == plan


def test_the_wide_setting_is_recorded_and_read_back() -> None:
    plan = plan_threads("auto", cores=4, streams=2)
    assert plan.runtime_options()["wide"] is plan.wide
    record = plan.as_dict()
    assert record["wide"] == {"intra_op": 2, "spin": False, "from_rows": WIDE_FROM_ROWS}
    assert ThreadPlan.from_dict(record) == plan
    rows = " / ".join(f"{n} ({role})" for role, n in sorted(WIDE_FROM_ROWS.items()))
    assert plan.describe() == (
        f"1 thread, no spinning; 2 threads, no spinning, from {rows} rows; batches in 2 concurrent chunks"
    )
    assert record["decode_workers"] == plan.decode_workers == 2  # 4 cores / 2 streams
    legacy = {k: v for k, v in record.items() if k not in ("wide", "decode_workers")}  # before both existed
    assert ThreadPlan.from_dict(legacy).wide is None and ThreadPlan.from_dict(legacy).decode_workers == 1
    defaults = plan_threads(0)
    assert defaults.describe() == "ONNX Runtime's default threads, ONNX Runtime's spinning"
    assert defaults.session_config() == {}
    written_before = {**defaults.as_dict(), "policy": "ort-default"}  # the policy's spelling in older reports
    assert ThreadPlan.from_dict(written_before) == defaults


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
    runtime = OnnxRuntimeSession(exported(TEST_CONFIGS[0]).model("step"), providers=["cpu"], **plan.runtime_options())
    with runtime:
        settings = runtime.session_settings
        options = runtime.session.get_session_options()
    assert settings["intra_op_threads"] == options.intra_op_num_threads == plan.intra_op
    assert settings["inter_op_threads"] == plan.inter_op and settings["execution_mode"] == "sequential"
    expected = None if plan.spin is None else ("1" if plan.spin else "0")
    assert [settings[key] for key in SPIN_KEYS] == [expected, expected]


@pytest.mark.parametrize(("threads", "spin", "intra"), [("auto", False, 0), (2, True, 2), (None, None, 0)])
def test_on_a_gpu_provider_explicit_values_still_reach_the_session(threads, spin, intra) -> None:
    from edgecap.runtime.backends.onnxruntime.loader import _thread_options
    from edgecap.runtime.backends.registry import LoadRequest

    plan, options = _thread_options(LoadRequest(threads=threads, spin=spin), "CUDAExecutionProvider", {})
    assert plan is None  # the policy only runs on CPU
    runtime = OnnxRuntimeSession(exported(TEST_CONFIGS[0]).model("step"), providers=["cpu"], **options)
    with runtime:
        settings = runtime.session_settings
    assert settings["intra_op_threads"] == intra
    expected = None if spin is None else ("1" if spin else "0")
    assert [settings[key] for key in SPIN_KEYS] == [expected, expected]


def test_step_model_options_apply_the_plan_to_a_step_model() -> None:
    """The sessions' options and the step model's concurrent chunks, as one set of keyword arguments."""
    from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model

    plan = plan_threads("auto", cores=4, streams=2)
    options = plan.step_model_options()
    assert options == {**plan.runtime_options(), "decode_workers": 2}
    with create_onnxruntime_step_model(**exported(TEST_CONFIGS[0]).runtime_models("fp32"), **options) as step_model:
        assert step_model.decode_workers == 2
        assert step_model.step_runtime.session.get_session_options().intra_op_num_threads == plan.intra_op
