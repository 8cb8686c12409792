"""ONNX Runtime thread settings against each other: what ``threads="auto"`` costs against the best setting measured.

For each model (random weights at the paper settings, exported FP32, the encoder + step graphs), every thread setting
gets its own pair of sessions in this process, and one decode per setting is timed in turn (the order rotates every
round), so a drifting load hits all settings alike; medians of ``--repeats`` rounds after one warm-up round. The
decode is the full path from features to token ids, forced to a fixed length (every hypothesis runs every step:
26 radix tokens for ACORT, 19 words for ExpansionNet v2).

Settings: ``auto`` and ``dedicated`` (what :func:`edgecap.runtimes.threads.plan_threads` picks here), ORT's own
default (one spinning intra-op thread per physical core), and intra-op 1/2 × spinning on/off (``--threads``).
Settings that come out identical share one measurement. Loads: ``quiet``, and ``busy`` (``--competitors`` child
processes spinning ``while True: pass`` for the whole measurement; they inherit this process's CPU affinity).

Run it unpinned on a quiet machine for the docs' numbers (``docs/cpu.md``); the defaults finish in about six minutes
on a 2-core x86 CPU. Usage::

    python benchmarks/ort_threads.py --out /tmp/ort-threads
    python benchmarks/ort_threads.py --model acort-xsmall --batch 1 --repeats 9 --load busy
"""

from __future__ import annotations

import argparse
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
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's edgecap, not an installed one

from edgecap._io import atomic_write_json, atomic_write_text  # noqa: E402
from edgecap.decoding import DecodeCfg, RadixSpec, decode  # noqa: E402
from edgecap.export import export_onnx  # noqa: E402
from edgecap.export.spec import get_export_spec  # noqa: E402
from edgecap.models import create_model, get_model_cfg, paper_settings  # noqa: E402
from edgecap.runtimes.onnxruntime_session import create_ort_step_model  # noqa: E402
from edgecap.runtimes.threads import ThreadPlan, plan_threads, usable_cores  # noqa: E402

#: model -> (regions per image, forced decode length in tokens): ACORT decodes 2 radix tokens per word (13 words),
#: ExpansionNet v2 words; regions as the papers' features (36 bottom-up boxes; a 12 × 12 Swin-L grid).
PAPER_CASES = {"acort-xsmall": (36, 26), "expansionnet-v2": (144, 19)}
PAPER_WORDS = 10_000  # the COCO word vocabulary (without <unk>), which radix tokens encode in base 768
LOADS = ("quiet", "busy")


@dataclass(frozen=True)
class Setting:
    """One thread setting: its label and the plan applied to both sessions."""

    label: str
    plan: ThreadPlan

    @property
    def key(self) -> str:
        return json.dumps(self.plan.runtime_options(), sort_keys=True)


def settings(counts: Sequence[int], step_bytes: int, cores: int) -> list[Setting]:
    """The policies' picks, ORT's default and the sweep, one entry per distinct session setting (first label wins;
    the others are recorded as aliases in the results)."""
    out = [
        Setting("auto", plan_threads("auto", cores=cores, step_bytes=step_bytes)),
        Setting("dedicated", plan_threads("dedicated", cores=cores, step_bytes=step_bytes)),
        Setting("ort-default", plan_threads(0)),
    ]
    for count in counts:
        for spin in (False, True):
            out.append(Setting(f"{count}{' spin' if spin else ''}", plan_threads(count, spin)))
    return out


def decode_cfg(model: str, beam: int, steps: int) -> DecodeCfg:
    """Beam search forced to ``steps`` tokens, with the model's token layout (radix digits for ACORT)."""
    cfg = get_model_cfg(model)
    strategy = "beam" if beam > 1 else "greedy"
    if cfg.vocab_kind == "radix":
        base = cfg.radix_base
        digits = 1
        while base**digits < PAPER_WORDS:
            digits += 1
        ids = {"pad_id": 0, "bos_id": base + 1, "eos_id": base + 2, "radix": RadixSpec(base, digits, PAPER_WORDS)}
    else:
        ids = {"pad_id": 0, "bos_id": 1, "eos_id": 2}
    return DecodeCfg(strategy=strategy, beam_size=beam, max_len=steps, min_len=steps - 1, **ids)


def graphs_and_inputs(
    model_name: str, batches: Sequence[int], seed: int
) -> tuple[dict[str, Any], dict[int, dict[str, np.ndarray]]]:
    """The FP32 runtime graphs of a random-init model at the paper settings, and encoder inputs per batch size."""
    torch.manual_seed(seed)
    model = create_model(model_name, **paper_settings(model_name)).eval()
    graphs = export_onnx(model, None, precisions=["fp32"], parity=False).runtime_models("fp32")
    spec = get_export_spec(model)
    encoder = spec.graph(spec.runtime_graphs["encoder"])
    regions = PAPER_CASES[model_name][0]
    inputs = {}
    for batch in batches:
        made = encoder.make_inputs({"batch": batch, "regions": regions, "past": 0}, torch.Generator().manual_seed(seed))
        inputs[batch] = {name: made[name].numpy() for name in spec.decode_inputs}
    return graphs, inputs


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


def measure(
    step_models: Mapping[str, Any], inputs: Mapping[str, np.ndarray], cfg: DecodeCfg, repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall seconds and this process's CPU seconds (all its threads, spinning included) per decode of every setting,
    interleaved: one warm-up round, then ``repeats`` rounds whose order rotates, so each setting runs first as often
    as the others."""
    labels = list(step_models)
    wall: dict[str, list[float]] = {label: [] for label in labels}
    cpu: dict[str, list[float]] = {label: [] for label in labels}
    for round_ in range(repeats + 1):
        shift = round_ % len(labels)
        for label in labels[shift:] + labels[:shift]:
            start, start_cpu = time.perf_counter(), time.process_time()
            decode(step_models[label], inputs, cfg)
            elapsed, used = time.perf_counter() - start, time.process_time() - start_cpu
            if round_:
                wall[label].append(elapsed)
                cpu[label].append(used)
    return wall, cpu


def run(args: argparse.Namespace) -> dict[str, Any]:
    cores = usable_cores()
    rows: list[dict[str, Any]] = []
    for model_name in args.model:
        graphs, inputs = graphs_and_inputs(model_name, args.batch, args.seed)
        step_bytes = len(graphs["step"].SerializeToString())
        chosen = settings(args.threads, step_bytes, cores)
        distinct: dict[str, Setting] = {}
        aliases: dict[str, list[str]] = {}
        for setting in chosen:
            first = distinct.setdefault(setting.key, setting)
            aliases.setdefault(first.label, []).append(setting.label)
        with contextlib.ExitStack() as stack:
            step_models = {
                s.label: stack.enter_context(
                    create_ort_step_model(graphs["encoder"], graphs["step"], **s.plan.runtime_options())
                )
                for s in distinct.values()
            }
            cfg = decode_cfg(model_name, args.beam, PAPER_CASES[model_name][1])
            for load in args.load:
                for batch in args.batch:
                    with competitors(args.competitors if load == "busy" else 0):
                        times, cpu = measure(step_models, inputs[batch], cfg, args.repeats)
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
                        "auto_vs_best": medians["auto"] / medians[best],
                        "ort_default_vs_best": medians["ort-default"] / medians[best],
                    }
                    rows.append(row)
                    print(_row_line(row), flush=True)
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
        f"auto/best time {row['auto_vs_best']:.2f}, ORT default/best {row['ort_default_vs_best']:.2f}"
    )


def markdown(result: Mapping[str, Any]) -> str:
    """One table: captions/s per setting (median), and auto's and ORT default's time relative to the best."""
    rows = result["rows"]
    labels = list(dict.fromkeys(label for row in rows for label in row["captions_per_s"]))
    head = ["model", "load", "batch", *labels, "auto ÷ best", "ORT default ÷ best"]
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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", choices=sorted(PAPER_CASES), help="repeatable; default both")
    parser.add_argument("--batch", action="append", type=int, help="repeatable; default 1 and 16")
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--threads", action="append", type=int, help="intra-op counts to sweep; default 1 and 2")
    parser.add_argument("--load", action="append", choices=LOADS, help="repeatable; default quiet and busy")
    parser.add_argument("--competitors", type=int, default=1, help="busy processes under --load busy")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (after one warm-up round)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write ort_threads.json and ort_threads.md here")
    args = parser.parse_args(argv)
    args.model = args.model or list(PAPER_CASES)
    args.batch = args.batch or [1, 16]
    args.threads = args.threads or [1, 2]
    args.load = args.load or list(LOADS)
    if min(args.batch) < 1 or min(args.threads) < 1 or args.repeats < 1 or args.beam < 1:
        parser.error("--batch, --threads, --repeats and --beam must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # the export's torch work only; the sessions get their own threads
    result = run(args)
    table = markdown(result)
    print(table)
    if args.out is not None:
        atomic_write_json(args.out / "ort_threads.json", result)
        atomic_write_text(args.out / "ort_threads.md", table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
