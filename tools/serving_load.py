"""Load generators and bookkeeping of the serving benchmark (:mod:`tools.serving`).

Three shapes of load, all on the asyncio client of :mod:`edgecap.client` (one event loop: the load generator shares
the machine with the server, so it must cost as little CPU as possible):

* :func:`closed_loop`: N clients, each sending its next request when the previous one is answered (throughput);
* :func:`open_loop`: Poisson arrivals at a fixed rate, latency counted from the *scheduled* arrival, so a slow server
  cannot hide its queueing by slowing the sender down (coordinated omission);
* :func:`mixed_load`: a fixed list of good and bad requests from N clients, every outcome recorded per request id,
  then :func:`tally` checks that each was answered exactly once, with the right caption or its own error.

The statistics (:func:`percentile`, :func:`spread`) and :func:`tally` are pure and tested on synthetic data.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

#: Builds one client for worker ``i`` (an :class:`edgecap.client.AsyncCaptionClient`).
ClientFactory = Callable[[int], Any]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100, linear interpolation between order statistics), NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in 0..100, got {q}")
    if not values:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and the spread ``(max - min) / median`` in percent of several runs of one measurement."""
    if not values:
        raise ValueError("no runs to summarise")
    median = float(np.median(values))
    low, high = float(min(values)), float(max(values))
    return {
        "median": median,
        "min": low,
        "max": high,
        "spread_pct": (high - low) / median * 100 if median else math.nan,
        "runs": len(values),
    }


@dataclass(frozen=True)
class Request:
    """One request of a correctness run. ``expected`` is its caption, or None for a bad request (it must be refused
    with its own error)."""

    index: int
    payload: Any
    expected: str | None
    length_level: int | None = None
    beam: int | None = None
    why_bad: str = ""


@dataclass(frozen=True)
class Answer:
    """What one request got. ``kind``: ``caption``, ``invalid`` (the model refused it), ``unavailable`` (the server
    refused it: queue full, stopping, gone), ``timeout`` (no answer in time: lost), ``other``."""

    index: int
    kind: str
    caption: str | None
    error: str
    sent_s: float
    done_s: float


def classify(exc: BaseException) -> str:
    """An exception from the caption client -> an :class:`Answer` kind (a timeout wrapped in a retry error stays a
    timeout: it means no answer, not a refusal)."""
    from edgecap.client import CaptionRequestError, ServerBusyError

    cause: BaseException | None = exc
    seen: set[int] = set()
    while cause is not None and id(cause) not in seen:  # a chain may loop: ``raise exc from exc`` is its own cause
        if isinstance(cause, (TimeoutError, asyncio.TimeoutError)):
            return "timeout"
        seen.add(id(cause))
        cause = cause.__cause__
    if isinstance(exc, CaptionRequestError):
        return "invalid"
    if isinstance(exc, ServerBusyError):
        return "unavailable"
    return "other"


@dataclass
class Tally:
    """The exactly-once bookkeeping of a correctness run."""

    sent: int = 0
    good: int = 0
    bad: int = 0
    good_correct: int = 0
    good_wrong_caption: int = 0
    good_refused: int = 0
    bad_refused_alone: int = 0
    bad_answered: int = 0
    lost: int = 0
    duplicated: int = 0
    other_errors: int = 0
    drained_after_sigterm: int = 0
    accepted_after_sigterm: int = 0
    refused_after_sigterm: int = 0
    examples: list[str] = field(default_factory=list)

    def passed(self, sigterm: bool) -> bool:
        """No loss, no duplicate, no wrong caption, no bad request captioned. Without SIGTERM also every good request
        captioned and every bad one refused with its own error; after SIGTERM any explicit error is an answer."""
        clean = not (self.lost or self.duplicated or self.good_wrong_caption or self.bad_answered)
        strict = self.good_refused == 0 and self.other_errors == 0 and self.bad_refused_alone == self.bad
        return clean and (sigterm or strict)

    def as_dict(self, sigterm: bool) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed(sigterm)}


def tally(requests: Sequence[Request], answers: Sequence[Answer], sigterm_at: float | None = None) -> Tally:
    """Check every request against its answers: one answer each, the expected caption or an error of its own.

    After SIGTERM (``sigterm_at``, the clock of ``Answer.sent_s``/``done_s``) a good request may be refused
    (``unavailable``): an explicit error, not a loss. Captions finished after it count as drained (those also sent
    after it as accepted after SIGTERM), refusals after it as refused.
    """
    by_index: dict[int, list[Answer]] = {}
    for answer in answers:
        by_index.setdefault(answer.index, []).append(answer)
    out = Tally(sent=len(requests))
    unknown = set(by_index) - {r.index for r in requests}
    out.duplicated += sum(len(by_index[i]) for i in unknown)  # answers to nothing sent

    def note(text: str) -> None:
        if len(out.examples) < 10:
            out.examples.append(text)

    for request in requests:
        got = by_index.get(request.index, [])
        good = request.expected is not None
        out.good += good
        out.bad += not good
        if not got:
            out.lost += 1
            note(f"#{request.index}: no answer")
            continue
        out.duplicated += len(got) - 1
        answer = got[0]
        after = sigterm_at is not None and answer.done_s >= sigterm_at
        if answer.kind == "timeout":
            out.lost += 1
            note(f"#{request.index}: timed out ({answer.error})")
        elif answer.kind == "caption":
            if not good:
                out.bad_answered += 1
                note(f"#{request.index} ({request.why_bad}) was captioned {answer.caption!r}")
            elif answer.caption == request.expected:
                out.good_correct += 1
                out.drained_after_sigterm += after
                out.accepted_after_sigterm += after and answer.sent_s >= sigterm_at  # type: ignore[operator]
            else:
                out.good_wrong_caption += 1
                note(f"#{request.index}: {answer.caption!r} != {request.expected!r}")
        elif answer.kind == "invalid" and not good:
            out.bad_refused_alone += 1
        elif answer.kind == "unavailable" and sigterm_at is not None:
            out.good_refused += good
            out.bad_refused_alone += not good  # refused too: an explicit error of its own
            out.refused_after_sigterm += after
        elif answer.kind in ("invalid", "unavailable"):
            out.good_refused += good
            out.other_errors += not good
            note(f"#{request.index}: {answer.kind}: {answer.error}")
        else:
            out.other_errors += 1
            note(f"#{request.index}: {answer.kind}: {answer.error}")
    return out


# -- load generators --------------------------------------------------------------------------------------------------
@dataclass
class LoadResult:
    """Latencies (seconds) of the answered requests, the errors, and the wall time from the first send to the last
    answer."""

    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def per_s(self) -> float:
        return len(self.latencies_s) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        ms = [t * 1000 for t in self.latencies_s]
        return {
            "answered": len(ms),
            "errors": len(self.errors),
            "first_errors": self.errors[:3],
            "elapsed_s": round(self.elapsed_s, 3),
            "per_s": round(self.per_s, 2),
            "p50_ms": round(percentile(ms, 50), 2) if ms else None,
            "p90_ms": round(percentile(ms, 90), 2) if ms else None,
            "p99_ms": round(percentile(ms, 99), 2) if ms else None,
        }


async def closed_loop(
    make_client: ClientFactory, payloads: Sequence[Any], clients: int, duration_s: float
) -> LoadResult:
    """``clients`` clients, each with its own connection, send back to back for ``duration_s`` (then finish what is in
    flight)."""
    result = LoadResult()
    start = time.perf_counter()
    end = start + duration_s
    last = start

    async def worker(i: int) -> None:
        nonlocal last
        async with make_client(i) as client:
            n = i
            while time.perf_counter() < end:
                sent = time.perf_counter()
                try:
                    await client.caption(payloads[n % len(payloads)])
                    result.latencies_s.append(time.perf_counter() - sent)
                except Exception as exc:
                    result.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                last = max(last, time.perf_counter())
                n += clients

    await asyncio.gather(*(worker(i) for i in range(clients)))
    result.elapsed_s = last - start
    return result


def poisson_arrivals(rate_per_s: float, count: int, seed: int) -> np.ndarray:
    """``count`` arrival times (seconds from 0) of a Poisson process of ``rate_per_s``."""
    if rate_per_s <= 0 or count < 1:
        raise ValueError(f"need a rate > 0 and a count >= 1, got {rate_per_s} and {count}")
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate_per_s, count))


async def open_loop(
    make_client: ClientFactory, payloads: Sequence[Any], rate_per_s: float, count: int, seed: int
) -> LoadResult:
    """``count`` requests arriving as a Poisson process of ``rate_per_s``, on one multiplexed client; latency is
    counted from each request's scheduled arrival."""
    result = LoadResult()
    arrivals = poisson_arrivals(rate_per_s, count, seed)
    async with make_client(0) as client:
        start = time.perf_counter()

        async def one(n: int, due: float) -> None:
            try:
                await client.caption(payloads[n % len(payloads)])
                result.latencies_s.append(time.perf_counter() - due)
            except Exception as exc:
                result.errors.append(f"{type(exc).__name__}: {exc}"[:300])

        tasks = []
        for n, at in enumerate(arrivals):
            due = start + float(at)
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(n, due)))
        await asyncio.gather(*tasks)
        result.elapsed_s = time.perf_counter() - start
    return result


async def mixed_load(
    make_client: ClientFactory,
    requests: Sequence[Request],
    clients: int,
    on_answer: Callable[[int], None] | None = None,
) -> list[Answer]:
    """Send every request once (no retries: the client factory must build clients with ``retries=0``) from
    ``clients`` clients pulling from one list; ``on_answer(n)`` is called with the running count of answers."""
    answers: list[Answer] = []
    pending = iter(requests)

    async def worker(i: int) -> None:
        async with make_client(i) as client:
            for request in pending:  # shared iterator: each request is taken by exactly one worker
                sent = time.perf_counter()
                try:
                    reply = await client.caption_result(
                        request.payload, length_level=request.length_level, beam=request.beam
                    )
                    answer = Answer(request.index, "caption", reply.caption, "", sent, time.perf_counter())
                except Exception as exc:
                    text = f"{type(exc).__name__}: {exc}"[:300]
                    answer = Answer(request.index, classify(exc), None, text, sent, time.perf_counter())
                answers.append(answer)
                if on_answer is not None:
                    on_answer(len(answers))

    await asyncio.gather(*(worker(i) for i in range(clients)))
    return answers
