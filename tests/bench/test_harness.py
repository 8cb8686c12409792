"""The timing harness on scripted clocks: warm-up exclusion, the repeat rule, percentiles, the step-model proxy."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

import numpy as np
import pytest
import torch
from torch import Tensor

from edgecap.bench.harness import (
    LatencyStats,
    LoopCfg,
    TimedRefineModel,
    TimedStepModel,
    median_ci95,
    percentile,
    run_loop,
    timed_decoder,
)
from edgecap.runtime.decoding import DecodeCfg, decode


class FakeClock:
    """Time advances only when the code under test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- percentiles -----------------------------------------------------------------------------------------------------
def test_percentile_by_hand() -> None:
    values = [40.0, 10.0, 30.0, 20.0]  # sorted: 10 20 30 40
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 40.0
    assert percentile(values, 50) == pytest.approx(25.0)  # h = 1.5
    assert percentile(values, 90) == pytest.approx(37.0)  # h = 2.7 -> 30 + 0.7 * 10
    assert percentile([7.0], 99) == 7.0


def test_percentile_matches_numpy_linear() -> None:
    rng = random.Random(3)
    for n in (1, 2, 5, 17, 100, 101):
        values = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 1, 25, 50, 90, 95, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("q", [-1, 100.5])
def test_percentile_rejects_bad_q(q: float) -> None:
    with pytest.raises(ValueError, match="q must be in"):
        percentile([1.0], q)


def test_percentile_rejects_empty() -> None:
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)


def test_latency_stats_exact() -> None:
    times_s = [0.010, 0.020, 0.030, 0.040, 0.100]
    stats = LatencyStats.from_seconds(times_s)
    assert stats.count == 5
    assert stats.mean_ms == pytest.approx(40.0)
    assert stats.stdev_ms == pytest.approx(math.sqrt((30**2 + 20**2 + 10**2 + 0 + 60**2) / 4))
    assert stats.rel_stdev_pct == pytest.approx(100 * stats.stdev_ms / 40.0)
    assert (stats.min_ms, stats.max_ms) == pytest.approx((10.0, 100.0))
    assert stats.p50_ms == pytest.approx(30.0)
    assert stats.p90_ms == pytest.approx(40.0 + 0.6 * 60.0)  # h = 3.6
    assert stats.p99_ms == pytest.approx(40.0 + 0.96 * 60.0)  # h = 3.96
    assert stats.p50_ci95_ms is None  # fewer than 6 samples
    assert stats.total_s == pytest.approx(0.2)


def test_single_sample_has_zero_stdev() -> None:
    stats = LatencyStats.from_seconds([0.005])
    assert stats.stdev_ms == 0.0 and stats.p99_ms == pytest.approx(5.0)


@pytest.mark.parametrize("bad", [[], [0.1, -0.001], [float("nan")]])
def test_latency_stats_rejects_broken_timings(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        LatencyStats.from_seconds(bad)


def test_median_ci95_uses_order_statistics() -> None:
    values = [float(v) for v in range(1, 101)]  # n = 100: ranks 40 and 61
    assert median_ci95(values) == (40.0, 61.0)
    lo, hi = median_ci95([float(v) for v in range(1, 7)])  # n = 6: the whole range
    assert (lo, hi) == (1.0, 6.0)
    assert median_ci95([1.0] * 5) is None


# -- the repeat loop -------------------------------------------------------------------------------------------------
def test_warmup_runs_are_excluded() -> None:
    clock = FakeClock()
    durations = iter([100.0, 50.0] + [0.010, 0.020, 0.030, 0.040])  # two slow warm-ups, then four timed calls
    calls: list[int] = []

    def fn(i: int) -> int:
        calls.append(i)
        clock.advance(next(durations))
        return i * 10

    timings = run_loop(fn, LoopCfg(warmup=2, min_repeats=4, min_seconds=0.0), clock=clock)
    assert timings.warmup_s == pytest.approx([100.0, 50.0])
    assert timings.times_s == pytest.approx([0.010, 0.020, 0.030, 0.040])
    assert timings.values == [0, 10, 20, 30]
    assert calls == [0, 1, 0, 1, 2, 3]  # warm-up and timed calls each count from 0
    stats = timings.stats()
    assert stats.count == 4 and stats.max_ms == pytest.approx(40.0)
    assert stats.p50_ms == pytest.approx(25.0)


def test_loop_runs_until_count_and_duration() -> None:
    clock = FakeClock()

    def fn(i: int) -> None:
        clock.advance(0.25)

    timings = run_loop(fn, LoopCfg(warmup=0, min_repeats=3, min_seconds=2.0), clock=clock)
    assert len(timings.times_s) == 8  # 3 calls reach the count, 8 × 0.25 s reach 2 s
    timings = run_loop(fn, LoopCfg(warmup=1, min_repeats=5, min_seconds=0.5), clock=clock)
    assert len(timings.times_s) == 5  # the count is the binding rule
    timings = run_loop(fn, LoopCfg(warmup=0, min_repeats=2, min_seconds=100.0, max_repeats=6), clock=clock)
    assert len(timings.times_s) == 6  # the cap wins


def test_sync_runs_before_the_clock_is_read() -> None:
    clock = FakeClock()
    events: list[str] = []

    def fn(i: int) -> None:
        events.append("call")
        clock.advance(1.0)

    def sync() -> None:
        events.append("sync")
        clock.advance(0.5)  # work the call launched but did not wait for

    timings = run_loop(fn, LoopCfg(warmup=1, min_repeats=2, min_seconds=0.0), clock=clock, sync=sync)
    assert events == ["call", "sync"] * 3
    assert timings.times_s == pytest.approx([1.5, 1.5])


def test_on_call_reports_warmup_and_timed_calls() -> None:
    seen: list[tuple[int, bool]] = []
    run_loop(
        lambda i: None, LoopCfg(warmup=2, min_repeats=2, min_seconds=0.0), on_call=lambda i, w: seen.append((i, w))
    )
    assert seen == [(0, True), (1, True), (0, False), (1, False)]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"warmup": -1}, "warmup"),
        ({"min_repeats": 0}, "min_repeats"),
        ({"min_seconds": -1.0}, "min_seconds"),
        ({"min_repeats": 5, "max_repeats": 4}, "max_repeats"),
    ],
)
def test_loop_cfg_validation(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        LoopCfg(**kwargs)


# -- the step-model proxy --------------------------------------------------------------------------------------------
PAD, BOS, EOS = 0, 1, 2
VOCAB = 6


class ClockedStepModel:
    """Emits tokens 3, 4, 5, then EOS for every row; each call advances the fake clock by a fixed cost."""

    def __init__(self, clock: FakeClock, encode_s: float = 5.0, step_s: float = 2.0, select_s: float = 0.5) -> None:
        self.clock, self.costs = clock, (encode_s, step_s, select_s)

    def encode(self, inputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        self.clock.advance(self.costs[0])
        rows = inputs["features"].shape[0]
        return {"t": torch.zeros(rows, dtype=torch.long)}

    def step(self, tokens: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        self.clock.advance(self.costs[1])
        t = state["t"]
        target = torch.where(t < 3, t + 3, torch.full_like(t, EOS))
        logprobs = torch.full((len(t), VOCAB), -20.0)
        logprobs[torch.arange(len(t)), target] = 0.0
        return logprobs, {"t": t + 1}

    def select(self, state: dict[str, Tensor], index: np.ndarray) -> dict[str, Tensor]:
        self.clock.advance(self.costs[2])
        return {k: v.index_select(0, torch.from_numpy(index)) for k, v in state.items()}


def test_timed_step_model_splits_time_and_counts_steps() -> None:
    clock = FakeClock()
    inner = ClockedStepModel(clock)
    timed = TimedStepModel(inner, clock=clock)
    inputs = {"features": torch.zeros(2, 4, 3)}
    cfg = DecodeCfg(strategy="greedy", max_len=10, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    result = decode(timed, inputs, cfg)
    assert [h[0].tokens for h in result] == [[3, 4, 5], [3, 4, 5]]
    times = timed.times()
    assert times.encodes == 1 and times.encode_s == pytest.approx(5.0)
    assert times.steps == 4  # three words + EOS: the decode steps actually taken
    assert times.step_s == pytest.approx(8.0) and times.first_step_s == pytest.approx(2.0)
    assert times.step_rows == 8
    assert times.select_s == pytest.approx(0.5 * times.selects)
    timed.reset()
    assert timed.times().steps == 0 and timed.times().first_step_s is None


def test_timed_step_model_is_transparent_for_beam_search() -> None:
    clock = FakeClock()
    cfg = DecodeCfg(strategy="beam", beam_size=3, max_len=10, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    inputs = {"features": torch.zeros(3, 4, 3)}
    plain = decode(ClockedStepModel(clock), inputs, cfg)
    timed = TimedStepModel(ClockedStepModel(clock), clock=clock)
    proxied = decode(timed, inputs, cfg)
    assert [[h.tokens for h in hyps] for hyps in proxied] == [[h.tokens for h in hyps] for hyps in plain]
    assert timed.times().selects >= 1  # beam expansion went through the proxy


def test_timed_step_model_syncs_every_call() -> None:
    clock = FakeClock()
    syncs: list[int] = []
    timed = TimedStepModel(ClockedStepModel(clock), clock=clock, sync=lambda: (syncs.append(1), clock.advance(0.1)))
    cfg = DecodeCfg(strategy="greedy", max_len=10, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    decode(timed, {"features": torch.zeros(1, 2, 3)}, cfg)
    times = timed.times()
    assert len(syncs) == times.encodes + times.steps + times.selects
    assert times.encode_s == pytest.approx(5.1)  # the synchronised work counts for the call that launched it


class ClockedRefineModel:
    """A mask-predict model (one level of 3 positions, T = 4): always predicts 3, 4, EOS; each call costs time."""

    length_levels, refine_steps, eos_decay, mask_id = ((1, 3),), (4,), (1.0,), VOCAB

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def encode(self, inputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        self.clock.advance(5.0)
        return {"v": torch.zeros(inputs["features"].shape[0], 1)}

    def refine(self, tokens: Tensor, length_level: Tensor, state: dict[str, Tensor]) -> Tensor:
        self.clock.advance(3.0)
        logprobs = torch.full((*tokens.shape, VOCAB), -20.0)
        logprobs[:, 0, 3], logprobs[:, 1, 4], logprobs[:, 2, EOS] = 0.0, 0.0, 0.0
        return logprobs


def test_timed_refine_model_times_refinement_passes_as_decoder_steps() -> None:
    clock = FakeClock()
    timed = timed_decoder(ClockedRefineModel(clock), clock=clock)
    assert isinstance(timed, TimedRefineModel) and timed.length_levels == ((1, 3),)
    assert type(timed_decoder(ClockedStepModel(clock), clock=clock)) is TimedStepModel
    cfg = DecodeCfg(strategy="mask_predict", length_level=1, max_len=4, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    result = decode(timed, {"features": torch.zeros(2, 4, 3)}, cfg)
    assert [h[0].tokens for h in result] == [[3, 4], [3, 4]]
    times = timed.times()
    assert times.encodes == 1 and times.encode_s == pytest.approx(5.0)
    assert times.steps == 4 and times.step_s == pytest.approx(12.0)  # T = 4 passes of 3 s
    assert times.first_step_s == pytest.approx(3.0) and times.step_rows == 8 and times.selects == 0


def test_timed_step_model_keeps_split_decodes_and_counts_every_chunk() -> None:
    """A model that decodes batches as concurrent chunks does so through the proxy too; the totals add up the
    chunks (one encode each), and the report's breakdown takes their mean (they ran at the same time)."""
    from edgecap.bench.harness import StepTimes
    from edgecap.bench.measure import _breakdown, _Query

    clock = FakeClock()
    inner = ClockedStepModel(clock, encode_s=0.0, step_s=0.0, select_s=0.0)  # the fake clock is not per thread
    inner.decode_workers = 2  # type: ignore[attr-defined]
    timed = TimedStepModel(inner, clock=clock)
    assert timed.decode_workers == 2 and TimedStepModel(ClockedStepModel(clock)).decode_workers == 1
    cfg = DecodeCfg(strategy="greedy", max_len=10, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    result = decode(timed, {"features": torch.zeros(4, 4, 3)}, cfg)
    assert [h[0].tokens for h in result] == [[3, 4, 5]] * 4
    times = timed.times()
    assert (times.encodes, times.steps, times.step_rows) == (2, 8, 16)  # two chunks of 2 images, 4 steps each
    split = StepTimes(encode_s=0.2, step_s=0.8, select_s=0.1, first_step_s=0.1, encodes=2, steps=8, step_rows=16)
    query = _Query(backbone_s=None, steps=split, images=4, captions=4, tokens=16, words=12)
    breakdown = _breakdown([0.6], [query], None)
    assert breakdown.encoder_ms == pytest.approx(100.0) and breakdown.decoder_ms == pytest.approx(400.0)
    assert breakdown.select_ms == pytest.approx(50.0) and breakdown.steps == pytest.approx(4.0)
    assert breakdown.decoder_step_ms == pytest.approx(100.0)  # the mean step call
    assert breakdown.search_overhead_ms == pytest.approx(50.0)  # 600 ms of wall time, 550 in the chunks' phases
