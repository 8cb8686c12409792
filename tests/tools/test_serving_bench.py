"""The serving benchmark's pure parts: arguments, statistics, the exactly-once bookkeeping and the load generators on
a fake in-process client (no server: the measurements themselves are the benchmark's, not the tests')."""

from __future__ import annotations

import asyncio
import io
import math
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
import pytest
from PIL import Image

from edgecap.client import CaptionReply, CaptionRequestError, ServerBusyError
from tools.serving import correctness_requests, parse_args, server_flags, spread, synthetic_images
from tools.serving_load import (
    Answer,
    Request,
    classify,
    closed_loop,
    mixed_load,
    open_loop,
    percentile,
    poisson_arrivals,
    tally,
)
from tools.serving_process import diff, formed_batch


def test_arguments_default_to_the_documented_run_and_are_checked_before_work(tmp_path: Path) -> None:
    args = parse_args(["--bundle", "b", "--threads", "2", "--out", str(tmp_path / "r.json")])
    assert (args.precision, args.runs, args.clients, args.requests, args.correctness_clients) == (
        "int8",
        5,
        16,
        10_000,
        32,
    )
    assert args.threads == 2 and args.bad_fraction == 0.05
    flags = server_flags(args)
    assert flags[flags.index("--threads") + 1] == "2" and flags[flags.index("--max-queue-delay-us") + 1] == "0"
    deadline = parse_args(["--bundle", "b", "--wait-until", "17:05"]).wait_until
    assert time.strftime("%H:%M", time.gmtime(deadline)) == "17:05"
    bad_args = (["--threads", "many"], ["--runs", "0"], ["--bad-fraction", "1"], ["--wait-until", "5pm"])
    for bad in (*bad_args, ["--out", str(tmp_path)]):
        with pytest.raises(click.UsageError):
            parse_args(["--bundle", "b", *bad])
    with pytest.raises(click.UsageError):
        parse_args(["--bundle", "b", "--out", str(tmp_path / "missing" / "r.json")])


def test_percentile_and_spread() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0 and math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(values, 101)
    s = spread([10.0, 8.0, 12.0, 11.0, 9.0])
    assert (s["median"], s["min"], s["max"], s["spread_pct"], s["runs"]) == (10.0, 8.0, 12.0, 40.0, 5)
    with pytest.raises(ValueError):
        spread([])


def test_formed_batch_reads_triton_counters() -> None:
    before = {"nv_inference_count": 10.0, "nv_inference_exec_count": 5.0}
    after = {"nv_inference_count": 170.0, "nv_inference_exec_count": 15.0}
    assert formed_batch(diff(after, before)) == 16.0
    assert formed_batch({}) == 0.0


def test_poisson_arrivals_have_the_rate_and_are_reproducible() -> None:
    times = poisson_arrivals(50.0, 5000, seed=1)
    assert np.all(np.diff(times) > 0) and 5000 / times[-1] == pytest.approx(50.0, rel=0.05)
    assert np.array_equal(times, poisson_arrivals(50.0, 5000, seed=1))
    with pytest.raises(ValueError):
        poisson_arrivals(0.0, 10, seed=1)


def test_synthetic_images_are_jpeg_or_pixels() -> None:
    jpegs = synthetic_images(3, 64, seed=0, payload="jpeg")
    assert len(set(jpegs)) == 3 and Image.open(io.BytesIO(jpegs[0])).size == (64, 64)
    pixels = synthetic_images(2, 64, seed=0, payload="pixels")
    assert pixels[0].shape == (64, 64, 3) and pixels[0].dtype == np.uint8


def test_correctness_requests_are_five_percent_bad_of_every_kind() -> None:
    payloads, expected = [b"a", b"b", b"c"], ["cap a", "cap b", "cap c"]
    requests = correctness_requests(payloads, expected, 1000, 0.05)
    bad = [r for r in requests if r.expected is None]
    assert len(requests) == 1000 and len(bad) == 50 and [r.index for r in requests] == list(range(1000))
    assert len({r.why_bad for r in bad}) == 5
    good = [r for r in requests if r.expected is not None]
    assert all(r.expected == expected[payloads.index(r.payload)] for r in good)


def _answer(index: int, kind: str = "caption", caption: str | None = None, t: float = 1.0, sent: float = 0.5) -> Answer:
    return Answer(index, kind, caption, "" if kind == "caption" else f"{kind} error", sent, t)


def test_tally_counts_lost_duplicated_wrong_and_misanswered() -> None:
    requests = [
        Request(0, b"x", "a"),
        Request(1, b"y", "b"),
        Request(2, b"z", None, why_bad="junk"),
        Request(3, b"w", "d"),
    ]
    clean = [_answer(0, caption="a"), _answer(1, caption="b"), _answer(2, "invalid"), _answer(3, caption="d")]
    ok = tally(requests, clean)
    assert ok.passed(sigterm=False) and (ok.good_correct, ok.bad_refused_alone, ok.lost, ok.duplicated) == (3, 1, 0, 0)

    broken = [_answer(0, caption="a"), _answer(0, caption="a"), _answer(1, caption="wrong"), _answer(2, caption="x")]
    bad = tally(requests, [*broken, _answer(9, caption="?")])
    assert (bad.lost, bad.duplicated, bad.good_wrong_caption, bad.bad_answered) == (1, 2, 1, 1)
    assert not bad.passed(sigterm=False) and bad.examples

    timed_out = tally(requests, [*clean[:3], _answer(3, "timeout")])
    assert timed_out.lost == 1 and not timed_out.passed(sigterm=True)
    refused = tally(requests, [*clean[:3], _answer(3, "unavailable")])
    assert refused.good_refused == 1 and not refused.passed(sigterm=False)
    cut_off = tally(requests, [*clean[:3], _answer(3, "other")])  # e.g. the connection dropped: explicit, not silent
    assert cut_off.other_errors == 1 and cut_off.passed(sigterm=True) and not cut_off.passed(sigterm=False)


def test_tally_after_sigterm_counts_drained_accepted_and_refused() -> None:
    requests = [Request(i, b"x", "a") for i in range(4)]
    answers = [
        _answer(0, caption="a", t=1.0),  # before SIGTERM (at 2.0)
        _answer(1, caption="a", t=3.0, sent=1.5),  # in flight: drained
        _answer(2, caption="a", t=3.5, sent=2.5),  # sent after SIGTERM, still answered
        _answer(3, "unavailable", t=4.0, sent=3.0),  # refused: explicit
    ]
    t = tally(requests, answers, sigterm_at=2.0)
    assert t.passed(sigterm=True) and not t.passed(sigterm=False)
    assert (t.drained_after_sigterm, t.accepted_after_sigterm, t.refused_after_sigterm) == (2, 1, 1)


def test_client_errors_are_classified_and_a_wrapped_timeout_is_a_loss() -> None:
    assert classify(CaptionRequestError("bad")) == "invalid"
    assert classify(ServerBusyError("busy")) == "unavailable"
    try:
        try:
            raise TimeoutError("slow")
        except TimeoutError as exc:
            raise ServerBusyError("unavailable after 1 tries") from exc
    except ServerBusyError as wrapped:
        assert classify(wrapped) == "timeout"
    assert classify(RuntimeError("?")) == "other"
    looped = ConnectionResetError("server disconnected")
    looped.__cause__ = looped  # what ``raise exc from exc`` leaves: the chain must not loop forever
    assert classify(looped) == "other"


KNOWN = {bytes([i]) * 100: f"caption {i}" for i in range(3)}


class FakeClient:
    """An in-process stand-in for AsyncCaptionClient: captions the payloads of :data:`KNOWN` asked without options,
    refuses everything else."""

    def __init__(self, calls: list[Any]) -> None:
        self.calls = calls

    async def __aenter__(self) -> FakeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def caption_result(self, image: Any, *, length_level: int | None = None, beam: int | None = None) -> Any:
        self.calls.append(image)
        await asyncio.sleep(0)
        if not isinstance(image, bytes) or image not in KNOWN or beam is not None or length_level is not None:
            raise CaptionRequestError("refused")
        return CaptionReply(KNOWN[image])

    async def caption(self, image: Any) -> str:
        return str((await self.caption_result(image)).caption)


def test_mixed_load_sends_each_request_exactly_once() -> None:
    calls: list[Any] = []
    requests = correctness_requests(list(KNOWN), list(KNOWN.values()), 400, 0.05)
    seen: list[int] = []
    answers = asyncio.run(mixed_load(lambda i: FakeClient(calls), requests, 32, seen.append))
    assert len(calls) == 400 and seen == list(range(1, 401))
    result = tally(requests, answers)
    assert result.passed(sigterm=False) and result.good_correct == 380 and result.bad_refused_alone == 20


def test_closed_and_open_loop_measure_a_fake_client() -> None:
    calls: list[Any] = []
    closed = asyncio.run(closed_loop(lambda i: FakeClient(calls), list(KNOWN), clients=4, duration_s=0.05))
    assert closed.latencies_s and not closed.errors and closed.per_s > 0
    mixed = [next(iter(KNOWN)), 7]  # every other request refused
    opened = asyncio.run(open_loop(lambda i: FakeClient(calls), mixed, rate_per_s=2000, count=40, seed=0))
    summary = opened.summary()
    assert summary["answered"] == 20 and summary["errors"] == 20 and summary["p50_ms"] is not None
