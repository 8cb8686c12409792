"""ONNX Runtime thread settings against each other: what ``threads="auto"`` costs against the best setting measured.

For each model (random weights at the paper settings, exported FP32, the encoder + step graphs), every thread setting
gets its own worker process holding its pair of sessions (a spinning session's idle threads would otherwise steal
time from the next setting's decode in the same process), and one decode per setting is timed in turn (the order
rotates every round, with ``--settle`` seconds of sleep after each decode), so a drifting load hits all settings
alike; medians of ``--repeats`` rounds after one warm-up round. The decode is the full path from features to token
ids, forced to a fixed length (every hypothesis runs every step: 26 radix tokens for ACORT, 19 words for ExpansionNet
v2). Besides wall time each worker reports its CPU time per decode (all its threads): what the setting costs the
other work on the machine, and a steadier number than wall time on a shared host.

Settings: ``auto`` and ``dedicated`` (what :func:`edgecap.runtime.backends.threads.plan_threads` picks here; ``auto``
chooses
per call: one thread, plus on two or more usable cores a wide session for calls of many rows), ONNX Runtime's own
default (one
spinning intra-op thread per physical core), and intra-op 1/2 × spinning on/off (``--threads``). Settings whose
sessions behave alike share one measurement (one intra-op thread has no pool, so nothing spins; ``auto`` equals ``1``
on a single core).
Loads: ``quiet``, and ``busy`` (``--competitors`` child processes spinning ``while True: pass`` for the whole
measurement; they inherit this process's CPU affinity).

Run it unpinned on a quiet machine for the docs' numbers (``docs/cpu.md``); the defaults finish in about six minutes
on a 2-core x86 CPU. Usage::

    python -m research.onnxruntime_threads --out /tmp/onnxruntime-threads
    python -m research.onnxruntime_threads --model acort-xsmall --batch 1 --repeats 9 --load busy
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np

from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model
from edgecap.runtime.backends.threads import ThreadPlan, plan_threads, usable_cores
from tools.paper_cases import PAPER_CASES, run_and_report, write_case

LOADS = ("quiet", "busy")


@dataclass(frozen=True)
class Setting:
    """One thread setting: its label and the plan applied to both sessions."""

    label: str
    plan: ThreadPlan

    @property
    def key(self) -> str:
        """Equal for settings whose sessions behave alike: one intra-op thread has no pool, so nothing to spin."""
        options = self.plan.step_model_options()
        if self.plan.intra_op == 1 and self.plan.execution_mode == "sequential":
            options["session_config"] = {}
        options["wide"] = None if self.plan.wide is None else self.plan.wide.as_dict()
        return json.dumps(options, sort_keys=True)


def settings(counts: Sequence[int], step_bytes: int, cores: int) -> list[Setting]:
    """The policies' picks, ONNX Runtime's default and the sweep, one entry per distinct session setting (first label
    wins;
    the others are recorded as aliases in the results)."""
    out = [
        Setting("auto", plan_threads("auto", cores=cores, step_bytes=step_bytes)),
        Setting("dedicated", plan_threads("dedicated", cores=cores, step_bytes=step_bytes)),
        Setting("onnxruntime-default", plan_threads(0)),
    ]
    for count in counts:
        for spin in (False, True):
            out.append(Setting(f"{count}{' spin' if spin else ''}", plan_threads(count, spin)))
    return out


@contextlib.contextmanager
def competitors(count: int) -> Iterator[None]:
    """``count`` busy-looping child processes for the duration (none for 0)."""
    children = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        if children:
            time.sleep(0.5)  # let them reach the loop
        yield
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait()


class Worker:
    """One setting's sessions in their own process (``--worker``): a session's spinning threads cannot then steal
    time from another setting's decode in the same process. Decodes on request, reports wall and CPU seconds."""

    def __init__(self, case: Path, plan: ThreadPlan) -> None:
        command = [
            sys.executable,
            "-m",
            "research.onnxruntime_threads",
            "--worker",
            str(case),
            json.dumps(plan.as_dict()),
        ]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._read()  # "ready": sessions created

    def _read(self) -> str:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.process.args[-1]} exited with {self.process.wait()}")
        return line.strip()

    def decode(self, batch: int) -> tuple[float, float]:
        self.process.stdin.write(f"{batch}\n")
        self.process.stdin.flush()
        wall, cpu = self._read().split()
        return float(wall), float(cpu)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def worker_main(case: Path, plan_json: str) -> int:
    """The worker loop: sessions per the plan, then one decode per batch size read from stdin."""
    from edgecap.runtime.decoding import DecodeCfg, RadixSpec, decode

    plan = ThreadPlan.from_dict(json.loads(plan_json))
    fields = json.loads((case / "decode.json").read_text())
    radix = fields.pop("radix")
    cfg = DecodeCfg(radix=RadixSpec(*radix) if radix else None, **fields)
    inputs: dict[int, dict[str, np.ndarray]] = {}
    options = plan.step_model_options()
    with create_onnxruntime_step_model(case / "encoder.onnx", case / "step.onnx", **options) as step_model:
        print("ready", flush=True)
        for line in sys.stdin:
            batch = int(line)
            if batch not in inputs:
                with np.load(case / f"inputs_{batch}.npz") as data:
                    inputs[batch] = {name: data[name] for name in data.files}
            start, start_cpu = time.perf_counter(), time.process_time()
            decode(step_model, inputs[batch], cfg)
            print(time.perf_counter() - start, time.process_time() - start_cpu, flush=True)
    return 0


def measure(
    workers: Mapping[str, Worker], batch: int, repeats: int, settle: float
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall seconds and the worker's CPU seconds (all its threads, spinning included) per decode of every setting,
    interleaved: one warm-up round, then ``repeats`` rounds whose order rotates, so each setting runs first as often
    as the others; ``settle`` seconds of sleep after each decode let spinning threads go idle."""
    labels = list(workers)
    wall: dict[str, list[float]] = {label: [] for label in labels}
    cpu: dict[str, list[float]] = {label: [] for label in labels}
    for round_ in range(repeats + 1):
        shift = round_ % len(labels)
        for label in labels[shift:] + labels[:shift]:
            elapsed, used = workers[label].decode(batch)
            time.sleep(settle)
            if round_:
                wall[label].append(elapsed)
                cpu[label].append(used)
    return wall, cpu


def run(args: SimpleNamespace, scratch: Path) -> dict[str, Any]:
    cores = usable_cores()
    rows: list[dict[str, Any]] = []
    for model_name in args.model:
        case = scratch / model_name
        case.mkdir()
        step_bytes = write_case(model_name, args.batch, args.seed, args.beam, case)
        chosen = settings(args.threads, step_bytes, cores)
        distinct: dict[str, Setting] = {}
        aliases: dict[str, list[str]] = {}
        for setting in chosen:
            first = distinct.setdefault(setting.key, setting)
            aliases.setdefault(first.label, []).append(setting.label)
        workers = {s.label: Worker(case, s.plan) for s in distinct.values()}
        try:
            for load in args.load:
                for batch in args.batch:
                    with competitors(args.competitors if load == "busy" else 0):
                        times, cpu = measure(workers, batch, args.repeats, args.settle)
                    medians = {label: statistics.median(t) for label, t in times.items()}
                    best = min(medians, key=medians.__getitem__)
                    row = {
                        "model": model_name,
                        "step_mb": step_bytes / 2**20,
                        "load": load,
                        "batch": batch,
                        "beam": args.beam,
                        "captions_per_s": {label: batch / m for label, m in medians.items()},
                        "cpu_ms_per_caption": {label: 1e3 * statistics.median(c) / batch for label, c in cpu.items()},
                        "times_s": times,
                        "cpu_s": cpu,
                        "best": best,
                        "aliases": aliases,
                        "plans": {s.label: s.plan.as_dict() for s in chosen},
                        "auto_vs_best": medians["auto"] / medians[best],
                        "onnxruntime_default_vs_best": medians["onnxruntime-default"] / medians[best],
                    }
                    rows.append(row)
                    print(_row_line(row), flush=True)
        finally:
            for worker in workers.values():
                worker.close()
    return {
        "environment": {
            "cpu": platform.processor() or platform.machine(),
            "usable_cores": cores,
            "os_cpu_count": os.cpu_count(),
            "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "python": platform.python_version(),
            "onnxruntime": __import__("onnxruntime").__version__,
        },
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "rows": rows,
    }


def _row_line(row: Mapping[str, Any]) -> str:
    rates = ", ".join(
        f"{label} {rate:.2f} ({row['cpu_ms_per_caption'][label]:.0f} CPU ms)"
        for label, rate in row["captions_per_s"].items()
    )
    return (
        f"{row['model']} {row['load']} batch {row['batch']}: captions/s {rates}; best {row['best']}, "
        f"auto/best time {row['auto_vs_best']:.2f}, ONNX Runtime default/best {row['ort_default_vs_best']:.2f}"
    )


def markdown(result: Mapping[str, Any]) -> str:
    """One table: captions/s per setting (median), and auto's and ONNX Runtime default's time relative to the best."""
    rows = result["rows"]
    labels = list(dict.fromkeys(label for row in rows for label in row["captions_per_s"]))
    head = ["model", "load", "batch", *labels, "auto ÷ best", "ONNX Runtime default ÷ best"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(labels) + 2)]
    for row in rows:
        cells = [row["model"], row["load"], str(row["batch"])]
        cells += [f"{row['captions_per_s'][label]:.2f}" if label in row["captions_per_s"] else "–" for label in labels]
        cells += [f"{row['auto_vs_best']:.2f}", f"{row['ort_default_vs_best']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "CPU ms per caption (this process, all threads; spinning counts):", ""]
    lines += ["| " + " | ".join(head[:-2]) + " |", "|" + "---|" * 3 + "---:|" * len(labels)]
    for row in rows:
        cells = [row["model"], row["load"], str(row["batch"])]
        cells += [
            f"{row['cpu_ms_per_caption'][label]:.1f}" if label in row["cpu_ms_per_caption"] else "–" for label in labels
        ]
        lines.append("| " + " | ".join(cells) + " |")
    env = result["environment"]
    aliases = {label: same for row in rows for label, same in row["aliases"].items() if len(same) > 1}
    notes = [
        f"{env['usable_cores']} usable core(s), affinity {env['affinity']}, onnxruntime {env['onnxruntime']}; "
        f"beam {rows[0]['beam'] if rows else '–'}, medians of {result['config']['repeats']} interleaved decodes.",
        "Same sessions measured once: " + "; ".join(f"{k} = {', '.join(v)}" for k, v in aliases.items()),
    ]
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def check_args(args: SimpleNamespace) -> SimpleNamespace:
    """Defaults of the repeatable options, and the bounds the click types cannot check."""
    args.model = args.model or list(PAPER_CASES)
    args.batch = args.batch or [1, 16]
    args.threads = args.threads or [1, 2]
    args.load = args.load or list(LOADS)
    if min(args.batch) < 1 or min(args.threads) < 1 or args.repeats < 1 or args.beam < 1:
        raise click.UsageError("--batch, --threads, --repeats and --beam must be >= 1")
    return args


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--model", type=click.Choice(sorted(PAPER_CASES)), multiple=True, help="repeatable; default both")
@click.option("--batch", type=int, multiple=True, help="repeatable; default 1 and 16")
@click.option("--beam", type=int, default=3, show_default=True)
@click.option("--threads", type=int, multiple=True, help="intra-op counts to sweep; default 1 and 2")
@click.option("--load", type=click.Choice(LOADS), multiple=True, help="repeatable; default quiet and busy")
@click.option("--competitors", type=int, default=1, help="busy processes under --load busy", show_default=True)
@click.option("--repeats", type=int, default=5, help="timed rounds (after one warm-up round)", show_default=True)
@click.option("--settle", type=float, default=0.05, help="seconds of sleep after each decode", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--out", type=click.Path(path_type=Path), help="write onnxruntime_threads.json and onnxruntime_threads.md here"
)
@click.option("--worker", nargs=2, type=(click.Path(path_type=Path), str), hidden=True)
def main(**options: Any) -> None:
    # repeatable options come as tuples: a list, or None when not given (check_args sets the defaults)
    args = SimpleNamespace(**{k: list(v) or None if isinstance(v, tuple) else v for k, v in options.items()})
    if args.worker:
        case, plan_json = args.worker
        sys.exit(worker_main(Path(case), plan_json))
    sys.exit(run_and_report(check_args(args), run, markdown, "onnxruntime_threads"))


if __name__ == "__main__":
    main()
