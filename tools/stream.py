"""Benchmark of captioning streams (``docs/streams.md``, "Benchmarks"):

    python -m tools.stream --model acort-xsmall --precision int8 --threads 1 --runs 5

On synthetic 30 fps 640×480 H.264 clips written with PyAV into a temporary folder (removed afterwards;
:mod:`tools.stream_clips`), with one loaded captioner, ``--runs`` interleaved rounds of:

- ``throughput``: a clip whose scene changes every 2 s, at ``--every``: captioned samples per second, frame-to-caption
  latency p50/p99 and the real-time factor (seconds of video per second of wall clock; the target is >= 2);
- ``static``: one scene (a static camera: only sensor noise moves) with ``--on-change``: the share of samples skipped
  (target >= 90 %);
- ``changes``: the scene-change clip with ``--on-change``: for every change, how long after it (in stream time) the
  first caption came; the target is within one sample period;
- ``live``: a live source playing the scene-change clip at ``--live-fps`` (400) frames per second in wall time, every
  frame sampled (more than the model captions): drops counted, the queue's high-water mark, peak traced memory and
  the queue wait against the bound the queue's length sets.

Before the rounds, the on-change threshold's margin on these scenes: the cosine distances between pooled embeddings
of noisy frames of one scene, and between different scenes. Results print as markdown; ``--json FILE`` keeps them.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np

from tools import run_program
from tools.stream_clips import Clip, LiveClip, clip_frames, render_scenes, write_clip

__all__ = ["main"]

CHANGE_EVERY_S = 2.0


def _threads(value: str) -> int | str:
    return int(value) if value.isdigit() else value


def machine() -> dict[str, Any]:
    """Where the numbers come from: CPU, usable cores, versions, date."""
    import os

    import av
    import onnxruntime

    from edgecap.runtime.backends.cpu import cpu_model

    return {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "av": av.__version__,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _file_run(cap: Any, path: Path, **settings: Any) -> tuple[Any, list[Any]]:
    stream = cap.stream(str(path), **settings)
    events = list(stream)
    return stream.summary, events


def change_lags(events: list[Any], clip: Clip) -> list[float | None]:
    """For each scene change after the first scene, the stream time from the change to the first caption at or
    after it and before the next change (None: the scene was never captioned)."""
    lags: list[float | None] = []
    bounds = [*clip.changes_s, clip.seconds]
    for start, end in zip(bounds[1:-1], bounds[2:], strict=True):
        inside = [e.pts_s for e in events if start - 1e-6 <= e.pts_s < end]
        lags.append(min(inside) - start if inside else None)
    return lags


def calibrate(cap: Any, scenes: list[np.ndarray], clip: Clip) -> dict[str, float]:
    """Cosine distances of pooled embeddings: noisy frames of one scene (what a static camera shows) against their
    first frame, and different scenes against each other (what a change is)."""
    from edgecap.runtime.stream.sampling import pooled_embedding

    def embed(images: list[np.ndarray]) -> np.ndarray:
        vectors = np.asarray(pooled_embedding(cap, cap.inputs(images)), dtype=np.float64)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    within: list[float] = []
    for k in range(min(4, len(scenes))):
        one = Clip(8 / clip.fps, clip.fps, clip.width, clip.height, (0.0,), clip.noise)
        vectors = embed(list(clip_frames(one, [scenes[k]], seed=k)))
        within += [float(1.0 - vectors[0] @ v) for v in vectors[1:]]
    firsts = embed(
        [next(clip_frames(Clip(1 / clip.fps, clip.fps, clip.width, clip.height, (0.0,), 0.0), [s])) for s in scenes]
    )
    between = [float(1.0 - firsts[i] @ firsts[j]) for i in range(len(scenes)) for j in range(i + 1, len(scenes))]
    return {
        "within_max": max(within),
        "within_p50": float(np.median(within)),
        "between_min": min(between),
        "between_p50": float(np.median(between)),
    }


def _live_run(cap: Any, clip: Clip, scenes: list[np.ndarray], queue: int, max_batch: int) -> dict[str, Any]:
    """The live source through the pipeline under tracemalloc: the peak of traced memory in the first half of the
    run (the source's own frame buffers are made then) and in the second (a pipeline whose memory grew with the
    stream would peak higher there)."""
    source = LiveClip(clip, scenes)
    events = []
    peaks: list[int] = []
    tracemalloc.start()
    try:
        stream = cap.stream(source, fps=clip.fps, queue=queue, max_batch=max_batch)
        for event in stream:
            events.append(event)
            if not peaks and event.pts_s >= clip.seconds / 2:
                peaks.append(tracemalloc.get_traced_memory()[1])
                tracemalloc.reset_peak()
        peaks.append(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()
    summary = stream.summary
    caption_s = max(e.latency_s["caption"] for e in events)
    waits = [e.latency_s["queue"] for e in events]
    return {
        "samples": summary.samples,
        "captioned": summary.captioned,
        "dropped": summary.dropped,
        "high_water": stream.queue.high_water,
        "peak_traced_mb": peaks[0] / 1e6,
        "peak_traced_second_half_mb": peaks[-1] / 1e6,
        "queue_wait_max_s": max(waits),
        "queue_wait_bound_s": (queue / max_batch + 1) * caption_s,
        "latency_p50_s": summary.latency_p50_s,
        "latency_p99_s": summary.latency_p99_s,
    }


def run(args: SimpleNamespace, root: Path) -> dict[str, Any]:
    from edgecap.runtime.captioner import Captioner

    size = (640, 480)
    scenes = render_scenes(int(args.seconds // CHANGE_EVERY_S) + 1, seed=1, height=size[1])
    changing = Clip(args.seconds, 30.0, *size, tuple(np.arange(0, args.seconds, CHANGE_EVERY_S).tolist()))
    static = Clip(args.seconds, 30.0, *size, (0.0,))
    changes_path = write_clip(root / "changes.mp4", changing, scenes)
    static_path = write_clip(root / "static.mp4", static, scenes[:1])
    cap = Captioner.load(args.model, precision=args.precision, threads=_threads(args.threads))
    with cap:
        from edgecap.runtime.stream.sampling import ChangeGate

        threshold = args.on_change if args.on_change is not None else ChangeGate().threshold
        out: dict[str, Any] = {"machine": machine(), "runtime": cap.runtime_info["summary"], "threshold": threshold}
        out["calibration"] = calibrate(cap, scenes, changing)
        common = {"every": args.every, "max_batch": args.max_batch, "queue": args.queue}
        rounds: list[dict[str, Any]] = []
        live_clip = Clip(args.live_seconds, args.live_fps, *size, changing.changes_s)
        for r in range(args.runs):
            summary, _ = _file_run(cap, changes_path, **common)
            row: dict[str, Any] = {"throughput": summary.to_dict()}
            summary, _ = _file_run(cap, static_path, on_change=threshold, **common)
            row["static"] = summary.to_dict()
            summary, events = _file_run(cap, changes_path, on_change=threshold, **common)
            row["changes"] = {**summary.to_dict(), "lags_s": change_lags(events, changing)}
            row["live"] = _live_run(cap, live_clip, scenes, args.live_queue, args.max_batch)
            rounds.append(row)
            print(f"round {r + 1}/{args.runs}: {_round_line(row)}", file=sys.stderr, flush=True)
        out["rounds"] = rounds
        out["median"] = medians(rounds)
    return out


def _round_line(row: dict[str, Any]) -> str:
    t = row["throughput"]
    return (
        f"{t['captioned_per_s']:.2f} captioned/s, {t['real_time_factor']:.2f}x real time, "
        f"static skipped {row['static']['skipped']}/{row['static']['samples']}, live dropped {row['live']['dropped']}"
    )


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and spread (min-max) of the headline numbers over the rounds."""

    def spread(values: list[float]) -> dict[str, float]:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    def pick(section: str, key: str) -> dict[str, float]:
        return spread([float(r[section][key]) for r in rounds])

    skipped = [r["static"]["skipped"] / max(1, r["static"]["samples"]) * 100 for r in rounds]
    lags = [lag for r in rounds for lag in r["changes"]["lags_s"]]
    return {
        "captioned_per_s": pick("throughput", "captioned_per_s"),
        "real_time_factor": pick("throughput", "real_time_factor"),
        "latency_p50_s": pick("throughput", "latency_p50_s"),
        "latency_p99_s": pick("throughput", "latency_p99_s"),
        "static_skipped_pct": spread(skipped),
        "static_real_time_factor": pick("static", "real_time_factor"),
        "changes_missed": sum(lag is None for lag in lags),
        "changes_lag_max_s": max((lag for lag in lags if lag is not None), default=None),
        "changes_captioned": pick("changes", "captioned"),
        "changes_samples": rounds[0]["changes"]["samples"],
        "live_dropped": pick("live", "dropped"),
        "live_samples": pick("live", "samples"),
        "live_high_water": max(r["live"]["high_water"] for r in rounds),
        "live_peak_traced_mb": pick("live", "peak_traced_mb"),
        "live_peak_traced_second_half_mb": pick("live", "peak_traced_second_half_mb"),
        "live_queue_wait_max_s": pick("live", "queue_wait_max_s"),
        "live_queue_wait_bound_s": pick("live", "queue_wait_bound_s"),
        "live_latency_p99_s": pick("live", "latency_p99_s"),
    }


def markdown(result: dict[str, Any], args: SimpleNamespace) -> str:
    m, med = result["machine"], result["median"]

    def fmt(d: dict[str, float], scale: float = 1.0, digits: int = 2) -> str:
        return f"{d['median'] * scale:.{digits}f} ({d['min'] * scale:.{digits}f}-{d['max'] * scale:.{digits}f})"

    cal = result["calibration"]
    lag = med["changes_lag_max_s"]
    rows = [
        (f"captioned samples/s (--every {args.every:g})", fmt(med["captioned_per_s"])),
        ("real-time factor (media s / wall s)", fmt(med["real_time_factor"])),
        ("frame-to-caption latency p50, ms", fmt(med["latency_p50_s"], 1e3, 0)),
        ("frame-to-caption latency p99, ms", fmt(med["latency_p99_s"], 1e3, 0)),
        ("static camera, on-change: samples skipped, %", fmt(med["static_skipped_pct"], 1.0, 1)),
        ("static camera, on-change: real-time factor", fmt(med["static_real_time_factor"])),
        ("scene changes missed (all rounds)", str(med["changes_missed"])),
        ("largest change-to-caption lag, stream s", "-" if lag is None else f"{lag:.2f}"),
        (f"changes clip: captioned of {med['changes_samples']} samples", fmt(med["changes_captioned"], 1.0, 0)),
        (
            f"live {args.live_fps:g} fps, every frame: samples / dropped",
            f"{fmt(med['live_samples'], 1.0, 0)} / {fmt(med['live_dropped'], 1.0, 0)}",
        ),
        (f"live: queue high-water (queue {args.live_queue})", str(med["live_high_water"])),
        (
            "live: peak traced memory, first / second half of the run, MB",
            f"{fmt(med['live_peak_traced_mb'], 1.0, 1)} / {fmt(med['live_peak_traced_second_half_mb'], 1.0, 1)}",
        ),
        (
            "live: longest queue wait / its bound, s",
            f"{fmt(med['live_queue_wait_max_s'])} / {fmt(med['live_queue_wait_bound_s'])}",
        ),
        ("live: frame-to-caption p99, ms", fmt(med["live_latency_p99_s"], 1e3, 0)),
    ]
    lines = [
        f"`python -m tools.stream {' '.join(sys.argv[1:])}`".replace("  ", " "),
        "",
        f"{m['cpu']}, {m['cores']} cores; Python {m['python']}, onnxruntime {m['onnxruntime']}, PyAV {m['av']}; "
        f"{m['date']}. {result['runtime']}. Median of {args.runs} interleaved rounds (min-max).",
        "",
        f"On-change threshold {result['threshold']:g}; cosine distances of pooled embeddings on these scenes: noisy "
        f"frames of one scene up to {cal['within_max']:.4f} (median {cal['within_p50']:.4f}), different scenes from "
        f"{cal['between_min']:.4f} (median {cal['between_p50']:.4f}).",
        "",
        "| measure | median (min-max) |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows),
    ]
    return "\n".join(lines)


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--model", default="acort-xsmall", show_default=True, help="Bundle directory or name.")
@click.option("--precision", default="int8", show_default=True)
@click.option("--threads", default="1", show_default=True, help="ONNX Runtime threads.")
@click.option("--runs", type=click.IntRange(min=1), default=5, show_default=True, help="Interleaved rounds.")
@click.option("--seconds", type=float, default=20.0, show_default=True, help="Length of each clip.")
@click.option("--live-seconds", type=float, default=10.0, show_default=True, help="Length of the live run.")
@click.option("--every", type=float, default=0.5, show_default=True)
@click.option("--on-change", type=float, default=None, help="Threshold [default: the ChangeGate default].")
@click.option("--max-batch", type=int, default=8, show_default=True)
@click.option("--queue", type=int, default=16, show_default=True)
@click.option("--live-queue", type=int, default=8, show_default=True)
@click.option(
    "--live-fps",
    type=float,
    default=400.0,
    show_default=True,
    help="The live source's frame rate, every frame a sample.",
)
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Also write the results here.")
def cli(**options: Any) -> int:
    args = SimpleNamespace(**options)
    with tempfile.TemporaryDirectory(prefix="edgecap-stream-bench-") as tmp:
        started = time.perf_counter()
        result = run(args, Path(tmp))
        result["bench_wall_s"] = time.perf_counter() - started
    print(markdown(result, args))
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.stream ARGV``: the exit status."""
    return run_program(cli, argv)


if __name__ == "__main__":
    raise SystemExit(main())
