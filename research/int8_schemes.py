"""INT8 step schemes side by side: FP32 against static Q/DQ, dynamic and weight-only step graphs on ONNX Runtime.

One process exports the model once (random weights at edge settings, as ``research/decode_cache.py``), quantises its
step graph with every scheme through ``edgecap.workshop.export.calibration`` (the encoder graph stays FP32, so only the
step differs),
then times whole beam-search decodes (encoder included) at batch 1 and 16 with the variants interleaved, order
alternating per repeat. The decode is forced to ``--steps`` tokens (EOS forbidden before the last step) so every variant
runs the same number of steps. One intra-op thread, spinning as ONNX Runtime's default.

Usage::

    python -m research.int8_schemes --model acort-xsmall --steps 26 --repeats 7
    python -m research.int8_schemes --model expansionnet-v2 --steps 19 --repeats 5 --json en2.json
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import torch

from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model
from edgecap.runtime.decoding import decode
from edgecap.workshop.export import export_onnx
from edgecap.workshop.export.calibration import get_preset, quantize_graph, quantize_int8
from tools.files import write_json
from tools.random_models import random_setup

#: label -> (scheme, RolePolicy options) of the step graph; "static" is calibrated on the batch-16 decode.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "static": ("static", {}),
    "dynamic": ("dynamic", {}),
    "weight-only-8/128": ("weight-only", {"bits": 8, "block_size": 128}),
    "weight-only-8/32": ("weight-only", {"bits": 8, "block_size": 32}),
    "weight-only-4/32": ("weight-only", {"bits": 4, "block_size": 32}),
}
OPS = ("MatMul", "Gemm", "DequantizeLinear", "MatMulInteger", "MatMulNBits")


def step_graphs(name: str, steps: int, preset: str) -> tuple[dict[str, Any], Any, Any, dict[int, Any]]:
    """The FP32 graphs, every variant's step graph, the forced beam-3 DecodeCfg and the batch-1/16 inputs."""
    setups = {batch: random_setup(name, batch, 0) for batch in (1, 16)}
    cfg = setups[1].decode_cfg.replace(beam_size=3, min_len=steps - 1, max_len=steps)
    result = export_onnx(setups[1].model, None, precisions=["fp32"], parity=False)
    fp32 = result.runtime_models("fp32")
    base = get_preset(preset)
    steps_by_variant = {"fp32": fp32["step"]}
    for label, (scheme, options) in VARIANTS.items():
        chosen = base.with_scheme("step", scheme, **options)
        if scheme == "static":
            feeds = [{k: v.numpy() for k, v in setups[16].batches[0].items()}]
            steps_by_variant[label] = quantize_int8(fp32, result.spec, feeds, cfg, chosen, progress=False).models[
                "step"
            ]
        else:
            steps_by_variant[label] = quantize_graph(fp32["step"], [], chosen, role="step").model
    return fp32, steps_by_variant, cfg, {b: s.batches[0] for b, s in setups.items()}


def measure(args: SimpleNamespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    fp32, variants, cfg, inputs = step_graphs(args.model, args.steps, args.preset)
    rows: dict[str, Any] = {}
    for label, model in variants.items():
        counts = Counter(n.op_type for n in model.graph.node)
        rows[label] = {"step_mb": model.ByteSize() / 1e6, "ops": {op: counts[op] for op in OPS if counts[op]}}
    times: dict[tuple[str, int], list[float]] = {(k, b): [] for k in variants for b in inputs}
    with contextlib.ExitStack() as stack:
        models = {
            k: stack.enter_context(
                create_onnxruntime_step_model(fp32["encoder"], m, intra_op_threads=1, inter_op_threads=1)
            )
            for k, m in variants.items()
        }
        for i in range(args.warmup + args.repeats):
            order = list(variants) if i % 2 == 0 else list(variants)[::-1]
            for batch, feed in inputs.items():
                for label in order:
                    start = time.perf_counter()
                    decode(models[label], feed, cfg)
                    if i >= args.warmup:
                        times[label, batch].append(time.perf_counter() - start)
    for batch in inputs:
        reference = statistics.median(times["fp32", batch])
        for label in variants:
            median = statistics.median(times[label, batch])
            rows[label][f"batch{batch}"] = {
                "median_s": median,
                "captions_per_s": batch / median,
                "x_fp32": reference / median,
            }
    return {"model": args.model, "steps": args.steps, "beam": 3, "preset": args.preset, "rows": rows}


def check_args(args: SimpleNamespace) -> SimpleNamespace:
    """The options the click types cannot check on their own."""
    if args.steps < 2 or args.repeats < 1 or args.warmup < 0:
        raise click.UsageError("--steps must be >= 2, --repeats >= 1, --warmup >= 0")
    return args


def execute(args: SimpleNamespace) -> int:
    out = measure(args)
    print(f"{out['model']}: beam 3, {out['steps']} forced tokens, 1 thread, preset {out['preset']}")
    print("| step | MB | batch 1 ms | × FP32 | batch 16 ms | × FP32 | ops |\n|---|---:|---:|---:|---:|---:|---|")
    for label, row in out["rows"].items():
        b1, b16 = row["batch1"], row["batch16"]
        print(
            f"| {label} | {row['step_mb']:.2f} | {b1['median_s'] * 1e3:.1f} | {b1['x_fp32']:.2f} | "
            f"{b16['median_s'] * 1e3:.1f} | {b16['x_fp32']:.2f} | {row['ops']} |"
        )
    if args.json is not None:
        write_json(args.json, out)
    return 0


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--model", default="acort-xsmall", show_default=True)
@click.option("--steps", type=int, default=26, help="forced decode length (tokens)", show_default=True)
@click.option("--repeats", type=int, default=5, show_default=True)
@click.option("--warmup", type=int, default=1, show_default=True)
@click.option("--preset", default="cpu-auto", help="the preset whose types the schemes use", show_default=True)
@click.option("--json", type=click.Path(path_type=Path), help="also write the results here")
def main(**options: Any) -> None:
    # repeatable options come as tuples: a list, or None when not given (execute sets the defaults)
    args = SimpleNamespace(**{k: list(v) or None if isinstance(v, tuple) else v for k, v in options.items()})
    sys.exit(execute(check_args(args)))


if __name__ == "__main__":
    main()
