"""Timing primitives: a warm-up-excluded, duration-based repeat loop, latency statistics, and a timing proxy around a
:class:`~edgecap.runtime.decoding.StepModel`.

The loop follows optimum-benchmark's latency tracker: a
number of untimed warm-up calls, then timed calls until *both* a minimum count and a minimum timed duration are
reached, so a fast configuration gets enough samples for a stable median and a slow one is not cut at a handful.
Statistics are those MLPerf Inference and optimum-benchmark report: mean, sample standard deviation, relative
standard deviation, p50/p90/p95/p99 (linear interpolation between order statistics, ``numpy.percentile``'s default,
which optimum-benchmark uses), plus a distribution-free 95 % confidence interval of the median so noise is visible.

Every clock is injectable (``clock=``): tests drive the loop with a scripted clock and check, exactly, that warm-up
calls are excluded and percentiles are right, never absolute speed.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

if TYPE_CHECKING:  # annotations only: importing the bench's timing code does not load the search
    from edgecap.runtime.decoding.protocol import State

__all__ = [
    "Clock",
    "LatencyStats",
    "LoopCfg",
    "StepTimes",
    "TimedRefineModel",
    "TimedStepModel",
    "Timings",
    "median_ci95",
    "percentile",
    "run_loop",
    "timed_decoder",
]

#: A monotonic clock in seconds (``time.perf_counter`` by default; tests pass a scripted one).
Clock = Callable[[], float]
T = TypeVar("T")

#: Percentiles every latency summary carries (MLPerf SingleStream reports p90, MultiStream p99; optimum all four).
PERCENTILES = (50, 90, 95, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 ≤ q ≤ 100) by linear interpolation between the closest ranks.

    With sorted values ``x[0] ≤ … ≤ x[n-1]`` the position is ``h = q/100 · (n − 1)`` and the result
    ``x[⌊h⌋] + (h − ⌊h⌋)·(x[⌊h⌋+1] − x[⌊h⌋])`` — the same as ``numpy.percentile(values, q)`` (method ``linear``).

    Raises:
        ValueError: ``values`` is empty or ``q`` is outside [0, 100].
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    h = q / 100.0 * (len(ordered) - 1)
    lo = math.floor(h)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo])


def median_ci95(values: Sequence[float]) -> tuple[float, float] | None:
    """A distribution-free 95 % confidence interval of the median (order statistics, normal approximation of the
    binomial: ranks ``n/2 ∓ 1.96·√n/2``). None below 6 samples, where no such interval exists at 95 %."""
    n = len(values)
    if n < 6:
        return None
    ordered = sorted(values)
    half_width = 1.96 * math.sqrt(n) / 2.0
    lo = max(1, math.floor(n / 2.0 - half_width))  # 1-based ranks
    hi = min(n, math.ceil(n / 2.0 + half_width) + 1)
    return ordered[lo - 1], ordered[hi - 1]


@dataclass(frozen=True)
class LatencyStats:
    """Summary of repeated latencies, in milliseconds.

    Attributes:
        count: timed samples (warm-up excluded).
        mean_ms, stdev_ms: mean and sample standard deviation (n − 1; 0 for one sample).
        rel_stdev_pct: ``100 · stdev / mean`` (optimum-benchmark's ``stdev_``): above ~10 % the machine was noisy.
        min_ms, max_ms: extremes.
        p50_ms, p90_ms, p95_ms, p99_ms: percentiles (:func:`percentile`). With fewer than 100 samples p99 is
            interpolated between the largest values and should be read as an estimate.
        p50_ci95_ms: 95 % confidence interval of the median (:func:`median_ci95`), None below 6 samples.
        total_s: sum of the timed samples in seconds.
    """

    count: int
    mean_ms: float
    stdev_ms: float
    rel_stdev_pct: float
    min_ms: float
    max_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    p50_ci95_ms: tuple[float, float] | None
    total_s: float

    @classmethod
    def from_seconds(cls, times_s: Sequence[float]) -> LatencyStats:
        """Statistics of durations given in seconds.

        Raises:
            ValueError: no samples, or a negative/non-finite duration (a broken clock).
        """
        if not times_s:
            raise ValueError("no timed samples: LatencyStats needs at least one")
        bad = [t for t in times_s if not (math.isfinite(t) and t >= 0.0)]
        if bad:
            raise ValueError(f"durations must be finite and >= 0 seconds, got {bad[:3]}")
        ms = [1e3 * t for t in times_s]
        n = len(ms)
        mean = sum(ms) / n
        stdev = math.sqrt(sum((v - mean) ** 2 for v in ms) / (n - 1)) if n > 1 else 0.0
        p50, p90, p95, p99 = (percentile(ms, q) for q in PERCENTILES)
        return cls(
            count=n,
            mean_ms=mean,
            stdev_ms=stdev,
            rel_stdev_pct=100.0 * stdev / mean if mean > 0 else 0.0,
            min_ms=min(ms),
            max_ms=max(ms),
            p50_ms=p50,
            p90_ms=p90,
            p95_ms=p95,
            p99_ms=p99,
            p50_ci95_ms=median_ci95(ms),
            total_s=sum(times_s),
        )


# -- the repeat loop -------------------------------------------------------------------------------------------------
#: Upper bounds of a benchmark's numbers, far above any real measurement: beyond them a typo (``--batch 10**9``,
#: ``--min-seconds 1e9``) would allocate or loop for hours before failing. ``BenchCfg`` and ``LoopCfg`` refuse more.
MAX_BATCH = 4096
MAX_SYNTHETIC = 4096
MAX_WARMUP = 10_000
MAX_REPEATS = 1_000_000
MAX_MIN_SECONDS = 3600.0


@dataclass(frozen=True)
class LoopCfg:
    """How many times a measurement runs.

    Attributes:
        warmup: untimed calls first (allocator growth, lazy kernel selection, ONNX Runtime's first-run graph work);
            their durations are kept separately (``Timings.warmup_s``) as the cold-start signal, never in the
            statistics.
        min_repeats: timed calls at least.
        min_seconds: keep timing until the timed calls sum to at least this (optimum-benchmark's ``duration``).
        max_repeats: hard cap on timed calls, whatever ``min_seconds`` says.
    """

    warmup: int = 3
    min_repeats: int = 10
    min_seconds: float = 2.0
    max_repeats: int = 10_000

    def __post_init__(self) -> None:
        if not 0 <= self.warmup <= MAX_WARMUP:
            raise ValueError(f"warmup must be in 0..{MAX_WARMUP} (MAX_WARMUP), got {self.warmup}")
        if self.min_repeats < 1:
            raise ValueError(f"min_repeats must be >= 1, got {self.min_repeats}")
        if not (math.isfinite(self.min_seconds) and 0 <= self.min_seconds <= MAX_MIN_SECONDS):
            raise ValueError(f"min_seconds must be in 0..{MAX_MIN_SECONDS:g} (MAX_MIN_SECONDS), got {self.min_seconds}")
        if self.max_repeats > MAX_REPEATS:
            raise ValueError(f"max_repeats must be at most {MAX_REPEATS} (MAX_REPEATS), got {self.max_repeats}")
        if self.max_repeats < self.min_repeats:
            raise ValueError(f"max_repeats ({self.max_repeats}) must be >= min_repeats ({self.min_repeats})")


@dataclass
class Timings(Generic[T]):
    """What :func:`run_loop` measured.

    Attributes:
        times_s: durations of the timed calls, in call order.
        warmup_s: durations of the warm-up calls (excluded from every statistic).
        values: what each timed call returned, aligned with ``times_s``.
    """

    times_s: list[float] = field(default_factory=list)
    warmup_s: list[float] = field(default_factory=list)
    values: list[T] = field(default_factory=list)

    def stats(self) -> LatencyStats:
        return LatencyStats.from_seconds(self.times_s)


def run_loop(
    fn: Callable[[int], T],
    loop: LoopCfg,
    *,
    clock: Clock = time.perf_counter,
    sync: Callable[[], Any] | None = None,
    on_call: Callable[[int, bool], Any] | None = None,
) -> Timings[T]:
    """Call ``fn(i)`` ``loop.warmup`` times untimed, then time calls until ``loop`` is satisfied.

    Args:
        fn: one query; receives the call index (warm-up calls count from 0, timed calls count from 0 again) so the
            caller can cycle through its inputs.
        loop: warm-up and repeat rule.
        clock: seconds, monotonic.
        sync: called after ``fn`` and before the clock is read (``torch.cuda.synchronize`` on a GPU), so the time
            covers the work and not only its launch.
        on_call: ``on_call(i, warmup)`` after each call (progress display).

    Returns:
        Timed durations, warm-up durations and the timed calls' return values.
    """
    out: Timings[T] = Timings()
    for i in range(loop.warmup):
        start = clock()
        fn(i)
        if sync is not None:
            sync()
        out.warmup_s.append(clock() - start)
        if on_call is not None:
            on_call(i, True)
    total = 0.0
    i = 0
    while i < loop.max_repeats and (i < loop.min_repeats or total < loop.min_seconds):
        start = clock()
        value = fn(i)
        if sync is not None:
            sync()
        elapsed = clock() - start
        out.times_s.append(elapsed)
        out.values.append(value)
        total += elapsed
        if on_call is not None:
            on_call(i, False)
        i += 1
    return out


# -- the step-model timing proxy -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepTimes:
    """Time spent inside a :class:`~edgecap.runtime.decoding.StepModel` during one query.

    Attributes:
        encode_s: total time in ``encode`` (the encoder graph: with the backbone when it is inside it).
        step_s: total time in ``step`` (the decoder, one token per hypothesis per call).
        select_s: total time in ``select`` (beam expansion and reordering of the cache).
        first_step_s: the first ``step`` call (time to first token = backbone + encode + first step).
        encodes, steps, selects: number of calls; ``steps`` = decode iterations actually taken.
        step_rows: hypotheses advanced, summed over steps (``steps`` × live rows; fewer with pruning).
    """

    encode_s: float = 0.0
    step_s: float = 0.0
    select_s: float = 0.0
    first_step_s: float | None = None
    encodes: int = 0
    steps: int = 0
    selects: int = 0
    step_rows: int = 0


class TimedStepModel:
    """A :class:`~edgecap.runtime.decoding.StepModel` proxy that times ``encode``/``step``/``select`` of the model it
    wraps.

    Decoding code is unchanged: the search sees a step model, the proxy forwards every call and adds its duration to
    a running total (read with :meth:`times`, cleared with :meth:`reset`). On a GPU pass ``sync`` so each call's time
    covers its kernels; that adds one synchronisation per call, which the end-to-end latency then includes too.
    It forwards the wrapped model's ``decode_workers``, so a batch decodes as concurrent chunks as it would unwrapped
    (``edgecap.runtime.decoding.parallel``); the totals then add up every chunk's calls (one ``encode`` per chunk),
    under a
    lock.

    Args:
        inner: the step model to time.
        clock: seconds, monotonic.
        sync: called at the end of every call before the clock is read, or None.
    """

    def __init__(self, inner: Any, clock: Clock = time.perf_counter, sync: Callable[[], Any] | None = None) -> None:
        self.inner = inner
        self.clock = clock
        self.sync = sync
        self._lock = threading.Lock()
        self.reset()

    @property
    def decode_workers(self) -> int:
        """The wrapped model's (1 when it has none)."""
        return getattr(self.inner, "decode_workers", 1)

    def reset(self) -> None:
        """Zero the totals (call before each query)."""
        self._encode = self._step = self._select = 0.0
        self._first_step: float | None = None
        self._encodes = self._steps = self._selects = self._rows = 0

    def times(self) -> StepTimes:
        """The totals since the last :meth:`reset`."""
        return StepTimes(
            encode_s=self._encode,
            step_s=self._step,
            select_s=self._select,
            first_step_s=self._first_step,
            encodes=self._encodes,
            steps=self._steps,
            selects=self._selects,
            step_rows=self._rows,
        )

    def _elapsed(self, start: float) -> float:
        if self.sync is not None:
            self.sync()
        return self.clock() - start

    def encode(self, inputs: Mapping[str, Any]) -> State:
        start = self.clock()
        state = self.inner.encode(inputs)
        elapsed = self._elapsed(start)
        with self._lock:
            self._encode += elapsed
            self._encodes += 1
        return state

    def _count_step(self, start: float, rows: int) -> None:
        """Book one decoder call (a step, or a refinement pass) that began at ``start`` and advanced ``rows``."""
        elapsed = self._elapsed(start)
        with self._lock:
            self._step += elapsed
            if self._first_step is None:
                self._first_step = elapsed
            self._steps += 1
            self._rows += rows

    def step(self, tokens: np.ndarray, state: State) -> tuple[Any, State]:
        start = self.clock()
        result = self.inner.step(tokens, state)
        self._count_step(start, int(tokens.shape[0]))
        return result

    def select(self, state: State, index: np.ndarray) -> State:
        start = self.clock()
        result = self.inner.select(state, index)
        elapsed = self._elapsed(start)
        with self._lock:
            self._select += elapsed
            self._selects += 1
        return result


class TimedRefineModel(TimedStepModel):
    """The timing proxy of a mask-predict :class:`~edgecap.runtime.decoding.mask_predict.RefineModel` (LaBERT):
    ``refine``
    passes count as decoder steps (``steps`` = refinement passes, ``first_step_s`` the first pass), so a report's
    encoder/decoder split means the same for both kinds of decoding; there is no ``select``."""

    @property
    def length_levels(self) -> tuple[tuple[int, int], ...]:
        return self.inner.length_levels

    @property
    def refine_steps(self) -> tuple[int, ...]:
        return self.inner.refine_steps

    @property
    def eos_decay(self) -> tuple[float, ...]:
        return self.inner.eos_decay

    @property
    def mask_id(self) -> int:
        return self.inner.mask_id

    def refine(self, tokens: np.ndarray, length_level: np.ndarray, state: State) -> Any:
        start = self.clock()
        result = self.inner.refine(tokens, length_level, state)
        self._count_step(start, int(tokens.shape[0]))
        return result


def timed_decoder(
    inner: Any, clock: Clock = time.perf_counter, sync: Callable[[], Any] | None = None
) -> TimedStepModel:
    """The timing proxy that fits ``inner``: :class:`TimedRefineModel` for a refine model (mask-predict), else
    :class:`TimedStepModel`."""
    cls = TimedRefineModel if callable(getattr(inner, "refine", None)) else TimedStepModel
    return cls(inner, clock=clock, sync=sync)
