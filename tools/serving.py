"""The serving benchmark: ``edgecap serve`` (Triton) against the same bundle called directly, on this machine.

Run it from a ``[cpu,serve]`` environment (``docs/serving-benchmarks.md``)::

    python -m tools.serving --bundle ~/.edgecap/bundles/acort-xsmall --precision int8 --out serving.json

It starts ``edgecap serve`` on loopback itself and measures, on synthetic images made on the fly (JPEG bytes, or
their pixels with ``--payload pixels``):

1. offline ``Captioner.batch`` images/s at the batch size the server forms under load (Triton's metrics), with the
   same runtime, precision and threads as each server instance;
2. served images/s from ``--clients`` closed-loop clients, over HTTP and gRPC: the ratio to (1);
3. at concurrency 1, the p50 latency served minus the p50 of a direct ``Captioner`` call on the same image;
4. Poisson arrivals at half the best served throughput: p50 and p99;
5. correctness: ``--requests`` requests, ``--bad-fraction`` of them bad, from ``--correctness-clients`` clients:
   exactly once, the direct caption or the request's own error; then again with SIGTERM sent to ``edgecap serve``
   halfway (drained vs refused).

Items 1-4 are measured ``--runs`` times, interleaved (offline, HTTP, gRPC, concurrency 1, open loop per run); the
report gives each run, the medians and the spread. Before each phase it waits (at most ``--max-wait-s``) while other
benchmarks keep the machine busy, and records the load it saw. No torch: this is the runtime half's benchmark.
"""

from __future__ import annotations

import asyncio
import calendar
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np
import psutil
from PIL import Image

from tools import run_program
from tools.files import write_json
from tools.serving_load import (
    Request,
    closed_loop,
    mixed_load,
    open_loop,
    percentile,
    spread,
    tally,
)
from tools.serving_process import (
    ServeProcess,
    diff,
    formed_batch,
    machine,
    own_pids,
    wait_for_quiet,
)

#: The targets: served/offline throughput, added p50 at concurrency 1, p99/p50 at half load.
MIN_THROUGHPUT_RATIO = 0.80
MAX_OVERHEAD_MS = 2.0
MAX_P99_OVER_P50 = 2.0


def _threads(_ctx: click.Context, _param: click.Parameter, value: str) -> int | str:
    if value in ("auto", "dedicated"):
        return value
    if not value.isdigit():
        raise click.BadParameter(f"auto, dedicated or a count, not {value!r}")
    return int(value)


def _wait_until(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    """HH:MM (UTC, today) as a Unix time."""
    if value is None:
        return None
    try:
        hour, minute = (int(v) for v in value.split(":"))
        day = time.gmtime()
        return calendar.timegm((day.tm_year, day.tm_mon, day.tm_mday, hour, minute, 0))
    except ValueError:
        raise click.BadParameter(f"HH:MM (UTC), not {value!r}") from None


def _out(_ctx: click.Context, _param: click.Parameter, value: Path | None) -> Path | None:
    """A report path whose folder exists and is writable, checked before any work."""
    if value is None:
        return None
    if value.is_dir():
        raise click.BadParameter(f"{value} is a directory")
    parent = value.resolve().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise click.BadParameter(f"{parent} is not a writable directory")
    return value


_POSITIVE = click.IntRange(min=1)
_SECONDS = click.FloatRange(min=0, min_open=True)


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--bundle", required=True, help="Bundle directory or exported model name.")
@click.option("--runtime", default="onnxruntime", show_default=True)
@click.option("--precision", default="int8", show_default=True)
@click.option(
    "--threads",
    default="auto",
    show_default=True,
    callback=_threads,
    help="Per server instance and for the direct captioner.",
)
@click.option("--instances", type=_POSITIVE, default=1, show_default=True)
@click.option("--max-batch", type=_POSITIVE, default=64, show_default=True)
@click.option("--max-queue-delay-us", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--max-queue-size", type=_POSITIVE, default=256, show_default=True)
@click.option("--runs", type=_POSITIVE, default=5, show_default=True, help="Interleaved runs of items 1-4.")
@click.option("--clients", type=_POSITIVE, default=16, show_default=True, help="Closed-loop clients (items 1-2).")
@click.option(
    "--phase-s", type=_SECONDS, default=8.0, show_default=True, help="Seconds of each throughput measurement."
)
@click.option(
    "--latency-calls", type=_POSITIVE, default=30, show_default=True, help="Calls per run and path at concurrency 1."
)
@click.option(
    "--open-loop-s", type=_SECONDS, default=12.0, show_default=True, help="Seconds of Poisson arrivals per run."
)
@click.option(
    "--requests",
    type=click.IntRange(min=0),
    default=10_000,
    show_default=True,
    help="Requests of each correctness run (0 = skip).",
)
@click.option("--correctness-clients", type=_POSITIVE, default=32, show_default=True)
@click.option("--bad-fraction", type=click.FloatRange(0, 1, max_open=True), default=0.05, show_default=True)
@click.option("--no-sigterm", is_flag=True, help="Skip the correctness run with SIGTERM halfway.")
@click.option("--payload", type=click.Choice(["jpeg", "pixels"]), default="jpeg", show_default=True)
@click.option("--images", type=_POSITIVE, default=48, show_default=True, help="Distinct synthetic images.")
@click.option("--image-size", type=click.IntRange(min=32), default=256, show_default=True)
@click.option(
    "--max-wait-s", type=float, default=300.0, show_default=True, help="Longest wait for other benchmarks, per phase."
)
@click.option(
    "--wait-until", default=None, callback=_wait_until, help="HH:MM (UTC, today): never wait for others past it."
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--out", type=click.Path(path_type=Path), default=None, callback=_out, help="Report JSON (written atomically)."
)
def cli(**options: Any) -> int:
    args = SimpleNamespace(**options)
    report = run(args)
    if args.out is not None:
        write_json(args.out, report, indent=1, default=str)
    print(json.dumps({k: report.get(k) for k in ("summary", "correctness", "sigterm")}, indent=1, default=str))
    return 0


def parse_args(argv: Sequence[str]) -> SimpleNamespace:
    """The arguments as the command sees them, checked before any work (the output path included); a bad one raises
    :class:`click.UsageError`."""
    with cli.make_context("python -m tools.serving", list(argv)) as ctx:
        return SimpleNamespace(**ctx.params)


def server_flags(args: SimpleNamespace) -> list[str]:
    return [
        "--runtime", args.runtime, "--precision", args.precision, "--threads", str(args.threads),
        "--instances", str(args.instances), "--max-batch", str(args.max_batch),
        "--max-queue-delay-us", str(args.max_queue_delay_us), "--max-queue-size", str(args.max_queue_size),
    ]  # fmt: skip


def synthetic_images(count: int, size: int, seed: int, payload: str) -> list[Any]:
    """``count`` smooth random RGB images (upsampled noise, so JPEG sizes are photo-like), as JPEG bytes or pixels."""
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for _ in range(count):
        small = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8))
        image = small.resize((size, size), Image.Resampling.BICUBIC)
        if payload == "pixels":
            out.append(np.asarray(image))
            continue
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def correctness_requests(payloads: Sequence[Any], expected: Sequence[str], count: int, bad_fraction: float) -> list:
    """``count`` requests, every ``1/bad_fraction``-th one bad, cycling through the kinds of bad request."""
    first = payloads[0] if isinstance(payloads[0], bytes) else b""
    bad: list[tuple[str, dict[str, Any]]] = [
        ("not an image", {"payload": b"this is not an image"}),
        ("truncated JPEG", {"payload": (first or b"\xff\xd8\xff")[:64]}),
        ("wrong shape (9x9x4)", {"payload": np.zeros((9, 9, 4), np.uint8)}),
        ("beam 0", {"payload": payloads[0], "beam": 0}),
        ("length level on a model without length control", {"payload": payloads[0], "length_level": 2}),
    ]
    every = round(1 / bad_fraction) if bad_fraction > 0 else 0
    requests = []
    for i in range(count):
        if every and i % every == every // 2:
            why, fields = bad[(i // every) % len(bad)]
            requests.append(Request(i, expected=None, why_bad=why, **fields))
        else:
            requests.append(Request(i, payloads[i % len(payloads)], expected[i % len(payloads)]))
    return requests


def async_client(url: str, model: str) -> Callable[[int], Any]:
    from edgecap.client import AsyncCaptionClient

    return lambda _i: AsyncCaptionClient(url, model, timeout_s=120, retries=0)


def offline_throughput(captioner: Any, payloads: Sequence[Any], batch: int, seconds: float, streams: int) -> float:
    """``Captioner.batch`` images/s at ``batch``, from ``streams`` threads (one per server instance)."""
    from concurrent.futures import ThreadPoolExecutor

    def loop(k: int) -> int:
        done, n, end = 0, k * batch, time.perf_counter() + seconds
        while time.perf_counter() < end:
            captioner.batch([payloads[(n + j) % len(payloads)] for j in range(batch)], batch_size=batch)
            done, n = done + batch, n + batch * streams
        return done

    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        images = sum(pool.map(loop, range(streams)))
    return images / (time.perf_counter() - start)


def served_throughput(server: ServeProcess, protocol: str, model: str, payloads: Sequence[Any], args: Any) -> dict:
    """Closed-loop images/s over ``protocol``, with the batch Triton formed and the CPU server and client used."""
    before, server_cpu, me = server.counters(), server.cpu_s(), psutil.Process().cpu_times()
    load = asyncio.run(closed_loop(async_client(server.url(protocol), model), payloads, args.clients, args.phase_s))
    delta = diff(server.counters(), before)
    client_cpu = sum(psutil.Process().cpu_times()[:2]) - sum(me[:2])
    return {
        **load.summary(),
        "formed_batch": round(formed_batch(delta), 2),
        "server_cpu_cores": round((server.cpu_s() - server_cpu) / load.elapsed_s, 2),
        "client_cpu_cores": round(client_cpu / load.elapsed_s, 2),
    }


def concurrency_one(captioner: Any, server: ServeProcess, model: str, image: Any, calls: int) -> dict[str, Any]:
    """Alternating direct, gRPC and HTTP calls on the same image, one at a time: p50 of each and the overheads."""
    from edgecap.client import CaptionClient

    times: dict[str, list[float]] = {"direct": [], "grpc": [], "http": []}
    with (
        CaptionClient(server.url("grpc"), model, retries=0) as grpc,
        CaptionClient(server.url("http"), model, retries=0) as http,
    ):
        paths = {"direct": captioner, "grpc": grpc.caption, "http": http.caption}
        for call in paths.values():
            call(image)
        for _ in range(calls):
            for name, call in paths.items():
                start = time.perf_counter()
                call(image)
                times[name].append((time.perf_counter() - start) * 1000)
    p50 = {name: percentile(values, 50) for name, values in times.items()}
    return {
        **{f"{name}_p50_ms": round(v, 3) for name, v in p50.items()},
        "grpc_overhead_ms": round(p50["grpc"] - p50["direct"], 3),
        "http_overhead_ms": round(p50["http"] - p50["direct"], 3),
    }


def correctness(server: ServeProcess, model: str, requests: list, clients: int, sigterm: bool) -> dict[str, Any]:
    """Send every request once from ``clients`` clients (half HTTP, half gRPC); with ``sigterm``, SIGTERM the server
    when half are answered. Server-side counts cross-check the client's (a request run twice would show there)."""
    urls = [server.url("http"), server.url("grpc")]
    factories = [async_client(url, model) for url in urls]
    sigterm_at: list[float] = []

    def on_answer(n: int) -> None:
        if sigterm and not sigterm_at and n >= len(requests) // 2:
            sigterm_at.append(time.perf_counter())
            server.sigterm()

    before = server.counters()
    start = time.perf_counter()
    answers = asyncio.run(mixed_load(lambda i: factories[i % 2](i), requests, clients, on_answer))
    finished = time.perf_counter()
    out: dict[str, Any] = {"wall_s": round(finished - start, 1), "clients": clients}
    out.update(tally(requests, answers, sigterm_at[0] if sigterm_at else None).as_dict(sigterm))
    why = {r.index: r.why_bad for r in requests if r.expected is None}
    out["bad_errors"] = {why[a.index]: a.error for a in answers if a.index in why and a.kind != "caption"}
    if sigterm:
        try:  # the clients are gone: the server finishes its drain on its own (a second SIGTERM would cut it short)
            out["serve_exit_code"] = server.process.wait(timeout=120)
            out["exit_after_sigterm_s"] = round(time.perf_counter() - sigterm_at[0], 1)
        except subprocess.TimeoutExpired:
            out["serve_exit_code"] = f"still running 120 s after the run, stopped: {server.stop()}"
        out["last_caption_after_sigterm_s"] = round(
            max((a.done_s for a in answers if a.kind == "caption"), default=0.0) - sigterm_at[0], 1
        )
        out["run_end_after_sigterm_s"] = round(finished - sigterm_at[0], 1)
    else:  # Triton counts a request the model refused as a success; it rejects a wrong shape before the model
        delta = diff(server.counters(), before)
        out["server_successes"] = int(delta.get("nv_inference_request_success", 0))
        out["server_failures"] = int(delta.get("nv_inference_request_failure", 0))
        reached_model = [a for a in answers if a.kind == "caption" or (a.kind == "invalid" and not _rejected(a))]
        out["server_successes_minus_answers_from_the_model"] = out["server_successes"] - len(reached_model)
    return out


def _rejected(answer: Any) -> bool:
    """A request Triton's frontend refused before the model saw it (a shape the model config does not allow)."""
    return "unexpected shape" in answer.error


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians, spreads and the targets of items 1-4 over the interleaved runs."""

    def over(key: Callable[[dict[str, Any]], float]) -> dict[str, float]:
        return {k: round(v, 3) for k, v in spread([key(r) for r in runs]).items()}

    out = {
        "offline_per_s": over(lambda r: r["offline_per_s"]),
        "http_per_s": over(lambda r: r["http"]["per_s"]),
        "grpc_per_s": over(lambda r: r["grpc"]["per_s"]),
        "http_ratio": over(lambda r: r["http"]["per_s"] / r["offline_per_s"]),
        "grpc_ratio": over(lambda r: r["grpc"]["per_s"] / r["offline_per_s"]),
        "direct_p50_ms": over(lambda r: r["concurrency_1"]["direct_p50_ms"]),
        "grpc_overhead_ms": over(lambda r: r["concurrency_1"]["grpc_overhead_ms"]),
        "http_overhead_ms": over(lambda r: r["concurrency_1"]["http_overhead_ms"]),
        "open_p50_ms": over(lambda r: r["open_loop"]["p50_ms"]),
        "open_p99_ms": over(lambda r: r["open_loop"]["p99_ms"]),
        "open_p99_over_p50": over(lambda r: r["open_loop"]["p99_ms"] / r["open_loop"]["p50_ms"]),
    }
    out["targets"] = {
        "http_ratio>=0.8": out["http_ratio"]["median"] >= MIN_THROUGHPUT_RATIO,
        "grpc_ratio>=0.8": out["grpc_ratio"]["median"] >= MIN_THROUGHPUT_RATIO,
        "grpc_overhead<=2ms": out["grpc_overhead_ms"]["median"] <= MAX_OVERHEAD_MS,
        "http_overhead<=2ms": out["http_overhead_ms"]["median"] <= MAX_OVERHEAD_MS,
        "open_p99<=2xp50": out["open_p99_over_p50"]["median"] <= MAX_P99_OVER_P50,
    }
    return out


def run(args: SimpleNamespace) -> dict[str, Any]:
    from edgecap.runtime.bundle.layout import find_bundle
    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.serving.repository import model_name_for

    bundle = Path(find_bundle(str(args.bundle)) or args.bundle)
    model = model_name_for(bundle)
    quiet: list[dict[str, Any]] = []

    def wait(phase: str) -> None:
        deadline = min(time.time() + args.max_wait_s, args.wait_until or math.inf)
        quiet.append(wait_for_quiet(phase, own_pids(), deadline))
        print(f"[{time.strftime('%H:%M:%S')}] {phase}: load {quiet[-1]['loadavg_1m']}", file=sys.stderr, flush=True)

    report: dict[str, Any] = {"command": [sys.executable, "-m", "tools.serving", *sys.argv[1:]]}
    report["quiet"] = quiet

    def save() -> None:  # after every phase: a crash or a kill keeps what was measured
        if args.out is not None:
            write_json(args.out, report, indent=1, default=str)

    report.update(machine=machine(), settings={**vars(args), "out": str(args.out), "bundle": str(bundle)})
    payloads = synthetic_images(args.images, args.image_size, args.seed, args.payload)
    threads = args.threads
    with (
        Captioner.load(bundle, args.runtime, args.precision, threads=threads, streams=args.instances) as direct,
        tempfile.TemporaryDirectory(prefix="edgecap-serving-bench-") as work,
    ):
        report["direct_captioner"] = direct.runtime_info["summary"]
        expected = [direct(p) for p in payloads]
        server = ServeProcess(bundle, server_flags(args), Path(work) / "serve.log")
        report["serve_command"] = server.command
        try:
            wait("warm-up")
            warm = {p: served_throughput(server, p, model, payloads, args) for p in ("http", "grpc")}
            batch = max(1, round(warm["grpc"]["formed_batch"]))
            rate = max(w["per_s"] for w in warm.values()) / 2
            report.update(warm_up=warm, offline_batch=batch, open_loop_rate_per_s=round(rate, 2))
            save()
            runs = []
            for r in range(args.runs):
                wait(f"run {r + 1}")
                one: dict[str, Any] = {
                    "offline_per_s": offline_throughput(direct, payloads, batch, args.phase_s, args.instances)
                }
                for protocol in ("http", "grpc"):
                    one[protocol] = served_throughput(server, protocol, model, payloads, args)
                one["concurrency_1"] = concurrency_one(direct, server, model, payloads[r], args.latency_calls)
                count = max(20, round(rate * args.open_loop_s))
                factory = async_client(server.url("grpc"), model)
                one["open_loop"] = asyncio.run(open_loop(factory, payloads, rate, count, args.seed + r)).summary()
                runs.append(one)
                report["runs"] = runs
                save()
                print(json.dumps(one), file=sys.stderr, flush=True)
            report.update(runs=runs, summary=summarise(runs))
            if args.requests:
                requests = correctness_requests(payloads, expected, args.requests, args.bad_fraction)
                wait("correctness")
                report["correctness"] = correctness(server, model, requests, args.correctness_clients, False)
                save()
                if not args.no_sigterm:
                    wait("correctness with SIGTERM")
                    report["sigterm"] = correctness(server, model, requests, args.correctness_clients, True)
        finally:
            report["serve_exit_code"] = server.stop()
            report["serve_log_tail"] = server.log_tail(1500)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tools.serving ARGV``: the exit status."""
    return run_program(cli, argv)


if __name__ == "__main__":
    raise SystemExit(main())
