"""Candidate step-graph cache layouts measured end to end against the exported one, before any is adopted.

The ORT/ACORT step graph takes the self-attention cache as one (B, L, H, T, d_k) input and returns it grown by one
position, so each step copies the whole cache three times inside the graph (a Split into layers, a Concat per
layer, the Concat that stacks the layers again) and once more in the beam reorder. Candidates:

- ``stacked``: one stacked (B, L, H, T, d_k) cache, the model's own state (the reference; the export's layout
  before per-layer caches became its default for ORT/ACORT);
- ``per-layer``: one cache input and output per decoder position (``self_k0``, ``self_k1`` …), so the graph's only
  cache copy is each layer's Concat (the Split and the stack are gone): ``ort_export_spec(model,
  cache_layout="per-layer")`` (:mod:`edgecap.workshop.export.specs.layer_caches`; the arithmetic of a step is
  unchanged).

Each candidate decodes the same random-init model (``tools.random_models.random_setup``) on ONNX Runtime (FP32,
one intra-op thread, spinning off) with a forced length, in interleaved order; the token ids must match the reference.
Times are per decode call (features to token ids, the init graph included), median of ``--repeats``, CPU time of the
calling thread by default (``--clock wall`` on a quiet machine; see ``step_profile.py``).

Usage::

    python -m research.step_layouts --batch 1 --batch 16 --repeats 11
"""

from __future__ import annotations

import contextlib
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import click
import torch
from torch import nn

from edgecap.runtime.decoding import decode
from edgecap.workshop.export.specs.layer_caches import CACHE_LAYOUTS
from tools.random_models import random_setup

LAYOUTS = CACHE_LAYOUTS
#: ``--clock`` choices: CPU time of the calling thread (ORT with one intra-op thread runs there; readable on a busy
#: machine) or wall time (a quiet machine).
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}


def export_layout(model: nn.Module, name: str) -> dict[str, Any]:
    """The FP32 runtime graphs (role -> ``onnx.ModelProto``) of ``model`` in cache layout ``name``: ``stacked`` is
    the model's own state (any family), ``per-layer`` the ORT/ACORT export's default."""
    from edgecap.workshop.export import export_onnx
    from edgecap.workshop.export.specs.layer_caches import PerLayerCaches
    from edgecap.workshop.export.specs.ort import ort_export_spec

    if name == "stacked" and not PerLayerCaches.applies_to(model):  # another family: its own export
        return export_onnx(model.eval(), None, precisions=["fp32"], parity=False).runtime_models("fp32")
    spec = ort_export_spec(model.eval(), cache_layout=name)
    return export_onnx(spec=spec, precisions=["fp32"], parity=False).runtime_models("fp32")


def run(args: SimpleNamespace) -> dict[int, dict[str, Any]]:
    from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model

    torch.set_num_threads(1)
    clock = CLOCKS[args.clock]
    setups = {b: random_setup(args.model, b, args.seed) for b in args.batch}
    model = setups[args.batch[0]].model.eval()
    graphs = {name: export_layout(model, name) for name in args.layout}
    options = {"intra_op_threads": 1, "inter_op_threads": 1, "session_config": {"session.intra_op.allow_spinning": "0"}}
    results: dict[int, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        models = {
            n: stack.enter_context(create_onnxruntime_step_model(g["encoder"], g["step"], **options))
            for n, g in graphs.items()
        }
        for batch, setup in setups.items():
            cfg = setup.decode_cfg.replace(strategy="beam" if args.beam > 1 else "greedy", beam_size=args.beam)
            cfg = cfg.replace(n_best=1, max_len=args.steps, min_len=args.steps - 1)
            inputs = setup.batches[0]
            tokens = {n: [h[0].tokens for h in decode(sm, inputs, cfg)] for n, sm in models.items()}
            times: dict[str, list[float]] = {n: [] for n in models}
            for i in range(args.repeats):
                for n in list(models) if i % 2 == 0 else list(models)[::-1]:
                    start = clock()
                    decode(models[n], inputs, cfg)
                    times[n].append(clock() - start)
            reference = args.layout[0]
            results[batch] = {
                n: {
                    "median_ms": 1e3 * statistics.median(t),
                    "captions_per_s": batch / statistics.median(t),
                    "same_tokens": tokens[n] == tokens[reference],
                }
                for n, t in times.items()
            }
    return results


def markdown(results: Mapping[int, Mapping[str, Mapping[str, Any]]], reference: str) -> str:
    lines = [
        "| batch | layout | ms per decode call | captions/s | vs reference | same tokens |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for batch, by_layout in results.items():
        base = by_layout[reference]["median_ms"]
        for name, r in by_layout.items():
            lines.append(
                f"| {batch} | {name} | {r['median_ms']:.2f} | {r['captions_per_s']:.1f} | {base / r['median_ms']:.3f}x "
                f"| {'yes' if r['same_tokens'] else 'NO'} |"
            )
    return "\n".join(lines)


def check_args(args: SimpleNamespace) -> SimpleNamespace:
    """The options the click types cannot check on their own."""
    args.layout = list(dict.fromkeys(args.layout or LAYOUTS))
    args.batch = args.batch or [1, 16]
    if min(args.batch) < 1 or args.beam < 1 or args.repeats < 1 or args.steps < 2:
        raise click.UsageError("--batch, --beam and --repeats must be >= 1 and --steps >= 2")
    return args


def execute(args: SimpleNamespace) -> int:
    print(markdown(run(args), args.layout[0]))
    command = shlex.join(["python", "research/step_layouts.py", *sys.argv[1:]])
    print(f"\ncommand: `{command}`; clock {args.clock}")
    return 0


@click.command(help=__doc__.split("\n\n")[0])
@click.option(
    "--model", default="acort-xsmall", help="an ORT-family model, random init (default acort-xsmall)", show_default=True
)
@click.option("--layout", type=click.Choice(LAYOUTS), multiple=True, help="layouts, the first is the reference (all)")
@click.option("--batch", type=int, multiple=True, help="images per decode call (repeatable; default 1 and 16)")
@click.option("--beam", type=int, default=3, show_default=True)
@click.option("--steps", type=int, default=26, help="forced decode steps (26)", show_default=True)
@click.option("--repeats", type=int, default=11, help="timed decode calls per layout (11)", show_default=True)
@click.option("--clock", type=click.Choice(sorted(CLOCKS)), default="cpu", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def main(**options: Any) -> None:
    # repeatable options come as tuples: a list, or None when not given (execute sets the defaults)
    args = SimpleNamespace(**{k: list(v) or None if isinstance(v, tuple) else v for k, v in options.items()})
    sys.exit(execute(check_args(args)))


if __name__ == "__main__":
    main()
