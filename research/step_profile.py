"""Where an ONNX Runtime beam decode spends its time, split the way the step graph's layout can change it.

Two measurements of one random-init model at edge settings (``tools.random_models.random_setup``: 1280-d 7x7
grid), its FP32 ``init`` and ``step`` graphs exported once and run on ONNX Runtime's CPU provider (intra-op threads
``--threads``, spinning off):

The graphs use the exported cache layout, or a candidate of ``step_layouts.py`` (``--layout``).

- **decode split**: full ``decode()`` calls (forced length: ``min_len = steps - 1``, ``max_len = steps``, so every
  hypothesis runs every step) through :class:`~edgecap.bench.harness.TimedStepModel`: the ``init`` graph
  (``encode``), the step graph's runs (``step``, including the adapter's few µs), the state gathers of the beam
  reorder (``select``) and the rest, the search's own numpy and Python (``search``);
- **step graph by node kind**: ORT's profiler (``SessionOptions.enable_profiling``) over step runs at fixed cache
  lengths (``--past``) on a real initial state, each node put in one kind: ``linear`` (a matmul with a weight
  initializer), ``attention`` (a matmul of two activations: q·kᵀ, weights·v), ``copy`` (Concat, Split, Gather,
  Slice, Squeeze, Transpose …: what the cache layout and the beam reorder pay), ``elementwise`` (adds, norms,
  softmax …) and ``other``. The kind comes from ORT's optimised graph (``optimized_model_filepath``), since ORT
  renames and fuses nodes. Each node counts with its median kernel time over the runs after the first; the
  profiler adds its own cost per node, so read the shares, not the sums.

``--clock cpu`` (the default) times with ``time.thread_time``: with one intra-op thread ORT runs in the calling
thread, so CPU time is the work done and stays readable on a shared, busy machine, where wall time mostly measures
the other processes. ``--clock wall`` for a quiet machine.

Usage::

    python -m research.step_profile --batch 1 --batch 16 --past 0 --past 12 --past 25
"""

from __future__ import annotations

import collections
import contextlib
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np
import torch

from edgecap.bench.harness import TimedStepModel
from edgecap.runtime.decoding import decode
from edgecap.workshop.export.specs.layer_caches import CACHE_LAYOUTS
from tools.kernel_floor import MATMUL_OPS, kernel_events, profile_runs
from tools.random_models import random_setup

LAYOUTS = CACHE_LAYOUTS
#: ``--clock`` choices: CPU time of the calling thread (ORT with one intra-op thread runs there; readable on a busy
#: machine) or wall time (a quiet machine).
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}


def export_layout(model: torch.nn.Module, name: str) -> dict[str, Any]:
    """The FP32 runtime graphs (role -> ``onnx.ModelProto``) of ``model`` in cache layout ``name``: ``stacked`` is
    the model's own state (any family), ``per-layer`` the ORT/ACORT export's default (``step_layouts.py``)."""
    from edgecap.workshop.export import export_onnx
    from edgecap.workshop.export.specs.layer_caches import PerLayerCaches
    from edgecap.workshop.export.specs.ort import ort_export_spec

    if name == "stacked" and not PerLayerCaches.applies_to(model):  # another family: its own export
        return export_onnx(model.eval(), None, precisions=["fp32"], parity=False).runtime_models("fp32")
    spec = ort_export_spec(model.eval(), cache_layout=name)
    return export_onnx(spec=spec, precisions=["fp32"], parity=False).runtime_models("fp32")


#: Node kinds, in report order; see the module docstring.
KINDS = ("linear", "attention", "copy", "elementwise", "other")
COPY_OPS = frozenset(
    {"Concat", "Split", "Gather", "GatherElements", "GatherND", "Slice", "Squeeze", "Unsqueeze", "Transpose"}
    | {"Expand", "Tile", "Identity", "Reshape", "Flatten", "ScatterND", "ScatterElements", "Pad"}
)
ELEMENTWISE_OPS = frozenset(
    {"Add", "Sub", "Mul", "Div", "Relu", "Gelu", "FastGelu", "BiasGelu", "Softmax", "LogSoftmax", "Where", "Cast"}
    | {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization", "Sqrt", "Pow", "Tanh"}
    | {"Sigmoid", "Exp", "Neg", "Erf", "ReduceMean", "ReduceSum", "Equal", "Less", "Not", "And", "QuickGelu"}
)


def node_kinds(model: Any) -> dict[str, str]:
    """Node name -> kind for an (ORT-optimised) ``onnx.ModelProto``: a matmul is ``linear`` when one of its inputs is
    an initializer (a weight), else ``attention``."""
    weights = {t.name for t in model.graph.initializer}
    kinds = {}
    for node in model.graph.node:
        kinds[node.name] = kind_of(node.op_type, any(i in weights for i in node.input))
    return kinds


def kind_of(op_type: str, has_weight: bool) -> str:
    """The kind of one node (see :data:`KINDS`)."""
    if op_type in MATMUL_OPS:
        return "linear" if has_weight else "attention"
    if op_type in COPY_OPS:
        return "copy"
    if op_type in ELEMENTWISE_OPS:
        return "elementwise"
    return "other"


def aggregate_profile(events: Iterable[Mapping[str, Any]], kinds: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """ORT profiler events of several runs -> ``{"kinds": kind -> µs per run, "ops": op type -> µs per run}``.

    Each node counts with the median of its kernel times over the runs after the first (which allocates and touches
    memory for the first time): a run preempted by another process (a busy machine) moves a mean, not a median. A
    node missing from ``kinds`` (ORT names some nodes only at run time) is
    classified by its op type alone."""
    durations: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for node, event in kernel_events(events):
        op = str(event.get("args", {}).get("op_name", ""))
        durations[(node, op)].append(float(event["dur"]))
    by_kind: collections.Counter[str] = collections.Counter({k: 0.0 for k in KINDS})
    by_op: collections.Counter[str] = collections.Counter()
    for (node, op), values in durations.items():
        us = statistics.median(values[1:] or values)
        by_kind[kinds.get(node) or kind_of(op, False)] += us
        by_op[op] += us
    return {"kinds": dict(by_kind), "ops": dict(by_op.most_common())}


def shares(values: Mapping[str, float]) -> dict[str, float]:
    """Each value as a percentage of their sum (all 0 when the sum is 0)."""
    total = sum(values.values())
    return {k: (100.0 * v / total if total else 0.0) for k, v in values.items()}


# -- measuring ---------------------------------------------------------------------------------------------------------
def profile_step(
    step_path: Path, state: Mapping[str, np.ndarray], pasts: Sequence[int], threads: int, runs: int
) -> dict[int, dict[str, dict[str, float]]]:
    """Per-kind kernel time of the step graph at each cache length in ``pasts`` (see the module docstring).

    ``state`` is a real initial state (cache length 0) of R hypotheses; the caches get ``past`` random positions.
    Image states (the cross-attention keys, once per image) have fewer rows, so R is the largest leading dimension."""
    tokens = np.full(max(value.shape[0] for value in state.values()), 5, dtype=np.int64)
    out: dict[int, dict[str, dict[str, float]]] = {}
    for past in pasts:
        feed: dict[str, np.ndarray] = {"tokens": tokens}
        for name, value in state.items():
            if 0 in value.shape[1:]:  # a self-attention cache: its empty axis is the cache length
                shape = tuple(past if size == 0 else size for size in value.shape)
                value = np.random.default_rng(past).standard_normal(shape, dtype=np.float32)
            feed[name] = value
        events, optimised = profile_runs(step_path, feed, runs, threads)
        out[past] = aggregate_profile(events, node_kinds(optimised))
    return out


def decode_split(
    step_model: Any, inputs: Mapping[str, Any], cfg: Any, warmup: int, repeats: int, clock: Callable[[], float]
) -> dict[str, float]:
    """Median ms per decode call of encode / step / select / search and the total (see the module docstring)."""
    timed = TimedStepModel(step_model, clock=clock)
    for _ in range(warmup):
        decode(step_model, inputs, cfg)
    parts: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(repeats):
        timed.reset()
        start = clock()
        decode(timed, inputs, cfg)
        total = clock() - start
        t = timed.times()
        parts["total"].append(total)
        parts["encode"].append(t.encode_s)
        parts["step"].append(t.step_s)
        parts["select"].append(t.select_s)
        parts["search"].append(total - t.encode_s - t.step_s - t.select_s)
        parts["steps"].append(t.steps)
    return {k: (statistics.median(v) * (1 if k == "steps" else 1e3)) for k, v in parts.items()}


def run(args: SimpleNamespace) -> dict[str, Any]:
    """Export once, then the decode split and the step profile per batch size."""
    from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model

    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    results: dict[str, Any] = {"decode": {}, "step_nodes": {}}
    with tempfile.TemporaryDirectory(prefix="step_profile_") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        setups = {b: random_setup(args.model, b, args.seed) for b in args.batch}
        model = setups[args.batch[0]].model
        graphs = export_layout(model, args.layout)
        paths = {role: work / f"{role}.onnx" for role in graphs}
        for role, graph in graphs.items():  # in-memory ModelProtos: the profiler needs files
            paths[role].write_bytes(graph.SerializeToString())
        options = {
            "intra_op_threads": args.threads,
            "inter_op_threads": 1,
            "session_config": {"session.intra_op.allow_spinning": "0"},
        }
        step_model = stack.enter_context(create_onnxruntime_step_model(paths["encoder"], paths["step"], **options))
        for batch, setup in setups.items():
            cfg = setup.decode_cfg.replace(strategy="beam" if args.beam > 1 else "greedy", beam_size=args.beam)
            cfg = cfg.replace(n_best=1, max_len=args.steps, min_len=args.steps - 1)
            inputs = setup.batches[0]
            split = decode_split(step_model, inputs, cfg, args.warmup, args.repeats, clock)
            split["captions_per_s"] = 1e3 * batch / split["total"]
            results["decode"][batch] = split
            if args.past:
                state = step_model.encode(inputs)
                rows = np.repeat(np.arange(batch), args.beam)
                state = {k: np.ascontiguousarray(v) for k, v in step_model.select(state, rows).items()}
                results["step_nodes"][batch] = profile_step(
                    paths["step"], state, args.past, args.threads, args.profile_runs
                )
    return results


# -- reporting ---------------------------------------------------------------------------------------------------------
def markdown(results: Mapping[str, Any], beam: int) -> str:
    """The decode split and the step graph's kinds, one table each."""
    lines = [
        "| batch | captions/s | total ms | init graph | step runs (ms/step) | select | search |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for batch, s in results["decode"].items():
        pct = shares({k: s[k] for k in ("encode", "step", "select", "search")})
        per_step = s["step"] / s["steps"] if s["steps"] else 0.0
        lines.append(
            f"| {batch} | {s['captions_per_s']:.1f} | {s['total']:.2f} | {s['encode']:.2f} ({pct['encode']:.0f} %) "
            f"| {s['step']:.2f} ({pct['step']:.0f} %; {per_step:.3f}) | {s['select']:.2f} ({pct['select']:.0f} %) "
            f"| {s['search']:.2f} ({pct['search']:.0f} %) |"
        )
    if results["step_nodes"]:
        lines += [
            "",
            f"| batch (rows) | cache length | profiled µs/step | {' | '.join(KINDS)} | top ops |",
            f"|---:|---:|---:|{'---:|' * len(KINDS)}---|",
        ]
        for batch, by_past in results["step_nodes"].items():
            for past, prof in by_past.items():
                pct = shares(prof["kinds"])
                top = ", ".join(
                    f"{op} {100 * us / sum(prof['ops'].values()):.0f} %" for op, us in list(prof["ops"].items())[:4]
                )
                lines.append(
                    f"| {batch} ({batch * beam}) | {past} | {sum(prof['kinds'].values()):.0f} | "
                    + " | ".join(f"{pct[k]:.0f} %" for k in KINDS)
                    + f" | {top} |"
                )
    return "\n".join(lines)


def check_args(args: SimpleNamespace) -> SimpleNamespace:
    """The options the click types cannot check on their own."""
    args.batch = args.batch or [1, 16]
    if min(args.batch) < 1 or args.beam < 1 or args.threads < 1 or args.repeats < 1 or args.profile_runs < 1:
        raise click.UsageError("--batch, --beam, --threads, --repeats and --profile-runs must be >= 1")
    if args.steps < 2:
        raise click.UsageError(f"--steps must be >= 2, got {args.steps}")
    if any(past < 0 or past >= args.steps for past in args.past or ()):
        raise click.UsageError(f"--past must lie in [0, --steps) = [0, {args.steps})")
    return args


def execute(args: SimpleNamespace) -> int:
    results = run(args)
    command = shlex.join(["python", "research/step_profile.py", *sys.argv[1:]])
    print(markdown(results, args.beam))
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    print(f"\ncommand: `{command}`; clock {args.clock}; load average {load}")
    if args.json:
        from tools.files import write_json

        write_json(args.json, {"command": command, "clock": args.clock, "load": load, "results": results})
    return 0


@click.command(help=__doc__.split("\n\n")[0])
@click.option(
    "--model", default="acort-xsmall", help="registered model, random init (default acort-xsmall)", show_default=True
)
@click.option("--batch", type=int, multiple=True, help="images per decode call (repeatable; default 1 and 16)")
@click.option("--beam", type=int, default=3, help="beam size (1 = greedy); default 3", show_default=True)
@click.option(
    "--steps", type=int, default=26, help="forced decode steps (max_len; min_len = steps - 1); 26", show_default=True
)
@click.option("--past", type=int, multiple=True, help="cache lengths to profile the step graph at (repeatable)")
@click.option(
    "--layout",
    type=click.Choice(LAYOUTS),
    default=LAYOUTS[0],
    help="step-graph cache layout (step_layouts.py)",
    show_default=True,
)
@click.option("--threads", type=int, default=1, help="ORT intra-op threads (default 1)", show_default=True)
@click.option(
    "--clock",
    type=click.Choice(sorted(CLOCKS)),
    default="cpu",
    help="cpu (thread time, default) or wall",
    show_default=True,
)
@click.option("--warmup", type=int, default=2, show_default=True)
@click.option("--repeats", type=int, default=7, help="timed decode calls per batch size (median); 7", show_default=True)
@click.option(
    "--profile-runs", type=int, default=50, help="profiled step runs per cache length (50)", show_default=True
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", type=click.Path(path_type=Path), help="also write the results to this JSON file")
def main(**options: Any) -> None:
    # repeatable options come as tuples: a list, or None when not given (execute sets the defaults)
    args = SimpleNamespace(**{k: list(v) or None if isinstance(v, tuple) else v for k, v in options.items()})
    sys.exit(execute(check_args(args)))


if __name__ == "__main__":
    main()
