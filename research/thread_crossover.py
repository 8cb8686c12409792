"""Where a second intra-op thread starts to pay, per graph role: the rows thresholds of ``threads="auto"``'s wide
session (:data:`edgecap.runtime.backends.threads.WIDE_FROM_ROWS`; ``docs/cpu.md``).

For each model (random weights at the paper settings, exported FP32, as ``research/onnxruntime_threads.py``) two
sessions
per graph live in this process: one intra-op thread, and ``--wide`` intra-op threads without spinning (what ``auto``
adds on free cores). One *call* of a graph is timed, not a decode: the step graph at each ``--rows`` count (hypotheses
= images × beam) with a cache half the forced decode length long, the encoder at each ``--batch`` size. The two
sessions alternate call by call (``--calls`` calls per sample, the order swapping every sample), medians of
``--repeats`` samples after one warm-up sample, wall and CPU time (this process, all threads) per call. A threshold is
the smallest size from which the wide session is faster at every larger size measured (none: never).

Non-spinning pool threads sleep between calls, so both sessions share one process without stealing from each other.
Run it on the cores the captioner will use, nothing else running (about three minutes on a 2-core x86 CPU)::

    python -m research.thread_crossover --out /tmp/crossover
    python -m research.thread_crossover --model expansionnet-v2 --rows 3 --rows 12 --rows 48 --batch 1
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np
import torch

from edgecap.runtime.backends.base import IMAGE_DIM
from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeSession
from edgecap.runtime.backends.threads import plan_threads, usable_cores
from edgecap.workshop.export.spec import get_export_spec
from edgecap.workshop.models import create_model, paper_settings
from tools.paper_cases import PAPER_CASES, run_and_report, write_case

#: Hypotheses per image in the step feeds (the decode the thresholds are for: beam 3).
BEAM = 3


def step_feed(spec: Any, model_name: str, rows: int, seed: int) -> dict[str, np.ndarray]:
    """A step-graph feed of ``rows`` hypotheses (``spec``: the model's export spec), its cache half the model's forced
    decode length long; image states once per image of ``BEAM`` hypotheses, as beam search feeds them (once per
    hypothesis when ``rows`` is no multiple of ``BEAM``)."""
    regions, steps = PAPER_CASES[model_name]
    graph = spec.graph(spec.runtime_graphs["step"])
    sizes = {"batch": rows, "regions": regions, "past": steps // 2}
    if IMAGE_DIM in spec.dims:
        sizes[IMAGE_DIM] = rows // BEAM if rows % BEAM == 0 else rows
    sizes = spec.sizes_for(graph, sizes)
    made = graph.make_inputs(sizes, torch.Generator().manual_seed(seed))
    return {name: made[name].numpy() for name in graph.inputs}


def time_pair(
    narrow: OnnxRuntimeSession, wide: OnnxRuntimeSession, feed: Mapping[str, np.ndarray], calls: int, repeats: int
) -> dict[str, dict[str, float]]:
    """Median wall and CPU ms per call of each session, the two alternating sample by sample."""
    sessions = {"1": narrow, "wide": wide}
    wall: dict[str, list[float]] = {k: [] for k in sessions}
    cpu: dict[str, list[float]] = {k: [] for k in sessions}
    for sample in range(repeats + 1):
        order = list(sessions) if sample % 2 else list(sessions)[::-1]
        for key in order:
            runtime = sessions[key]
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                runtime.infer(feed, check_inputs=False)
            if sample:
                wall[key].append((time.perf_counter() - start) / calls)
                cpu[key].append((time.process_time() - start_cpu) / calls)
    return {k: {"wall_ms": 1e3 * statistics.median(wall[k]), "cpu_ms": 1e3 * statistics.median(cpu[k])} for k in wall}


def threshold(points: Sequence[tuple[int, float]]) -> int | None:
    """The smallest size from which the wide session is faster at every larger size (``(size, wide ÷ narrow)``)."""
    found = None
    for size, ratio in sorted(points, reverse=True):
        if ratio >= 1.0:
            break
        found = size
    return found


def run(args: SimpleNamespace, scratch: Path) -> dict[str, Any]:
    narrow_plan, wide_plan = plan_threads(1), plan_threads(args.wide, False)
    rows: list[dict[str, Any]] = []
    thresholds: dict[str, dict[str, int | None]] = {}
    for model_name in args.model:
        case = scratch / model_name
        case.mkdir()
        step_bytes = write_case(model_name, args.batch, args.seed, 3, case)
        spec = get_export_spec(create_model(model_name, **paper_settings(model_name)))
        found: dict[str, int | None] = {}
        for role, sizes in (("encoder", args.batch), ("step", args.rows)):
            graph = case / f"{role}.onnx"
            narrow = OnnxRuntimeSession(graph, providers=["cpu"], name=f"{role}-1", **narrow_plan.runtime_options())
            wide = OnnxRuntimeSession(graph, providers=["cpu"], name=f"{role}-wide", **wide_plan.runtime_options())
            points = []
            with narrow, wide:
                for size in sizes:
                    if role == "step":
                        feed = step_feed(spec, model_name, size, args.seed)
                    else:
                        with np.load(case / f"inputs_{size}.npz") as data:
                            feed = {name: data[name] for name in data.files}
                    calls = max(1, args.calls // (1 if role == "step" else 4))
                    times = time_pair(narrow, wide, feed, calls, args.repeats)
                    ratio = times["wide"]["wall_ms"] / times["1"]["wall_ms"]
                    points.append((size, ratio))
                    row = {"model": model_name, "role": role, "rows": size, "step_mb": step_bytes / 2**20, **times}
                    row["wide_vs_1"] = ratio
                    rows.append(row)
                    print(
                        f"{model_name} {role} rows {size}: 1 thread {times['1']['wall_ms']:.3f} ms "
                        f"({times['1']['cpu_ms']:.3f} CPU), {args.wide} threads {times['wide']['wall_ms']:.3f} ms "
                        f"({times['wide']['cpu_ms']:.3f} CPU), wide ÷ 1 = {ratio:.2f}",
                        flush=True,
                    )
            found[role] = threshold(points)
        thresholds[model_name] = found
    return {
        "usable_cores": usable_cores(),
        "onnxruntime": __import__("onnxruntime").__version__,
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "rows": rows,
        "thresholds": thresholds,
    }


def markdown(result: Mapping[str, Any]) -> str:
    """Per graph call: ms wall (CPU) at 1 and ``--wide`` threads, their ratio; then the thresholds found."""
    wide = result["config"]["wide"]
    lines = [
        f"| model | graph | rows | 1 thread, ms (CPU ms) | {wide} threads no spin, ms (CPU ms) | wide ÷ 1 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        one, many = row["1"], row["wide"]
        lines.append(
            f"| {row['model']} | {row['role']} | {row['rows']} | {one['wall_ms']:.3f} ({one['cpu_ms']:.3f}) | "
            f"{many['wall_ms']:.3f} ({many['cpu_ms']:.3f}) | {row['wide_vs_1']:.2f} |"
        )
    found = "; ".join(
        f"{model}: " + ", ".join(f"{role} from {rows if rows is not None else 'never'}" for role, rows in roles.items())
        for model, roles in result["thresholds"].items()
    )
    return "\n".join(lines) + f"\n\nWide session pays (rows): {found}. {result['usable_cores']} usable core(s).\n"


def check_args(args: SimpleNamespace) -> SimpleNamespace:
    """Defaults of the repeatable options, and the bounds the click types cannot check."""
    args.model = args.model or ["acort-xsmall"]
    args.rows = args.rows or [3, 6, 12, 24, 48]
    args.batch = args.batch or [1, 2, 4, 8, 16]
    if min(args.rows + args.batch) < 1 or args.wide < 2 or args.calls < 1 or args.repeats < 1:
        raise click.UsageError("--rows, --batch, --calls and --repeats must be >= 1, --wide >= 2")
    return args


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--model", type=click.Choice(sorted(PAPER_CASES)), multiple=True, help="repeatable; default acort-xsmall")
@click.option("--rows", type=int, multiple=True, help="step rows, repeatable; default 3 6 12 24 48")
@click.option("--batch", type=int, multiple=True, help="encoder images, repeatable; default 1 2 4 8 16")
@click.option("--wide", type=int, default=2, help="intra-op threads of the wide session", show_default=True)
@click.option(
    "--calls", type=int, default=40, help="step calls per sample (a quarter for the encoder)", show_default=True
)
@click.option("--repeats", type=int, default=7, help="timed samples per session (after one warm-up)", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), help="write thread_crossover.json and .md here")
def main(**options: Any) -> None:
    # repeatable options come as tuples: a list, or None when not given (check_args sets the defaults)
    args = SimpleNamespace(**{k: list(v) or None if isinstance(v, tuple) else v for k, v in options.items()})
    sys.exit(run_and_report(check_args(args), run, markdown, "thread_crossover"))


if __name__ == "__main__":
    main()
