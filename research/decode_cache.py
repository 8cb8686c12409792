"""Cached step decoding vs re-running the whole prefix: wall-clock time per caption on CPU.

The reference ORT and ExpansionNet code decode without a cache: every step re-runs the decoder over the whole prefix
(:class:`~edgecap.workshop.torch_runtime.prefix.PrefixRerunStepModel`). edgecap decodes with a per-layer key/value cache
(:class:`~edgecap.workshop.torch_runtime.runtime.TorchStepModel`). Both run the same beam search on the same model, so
the difference measured here is the decoding algorithm alone.

To keep early EOS out of the comparison, the default (``forced``) setting decodes a fixed number of steps: the
DecodeCfg has ``min_len = steps - 1`` and ``max_len = steps``, so EOS is forbidden until the last step and every
hypothesis of every image runs all ``steps`` steps (e.g. ``--steps 25``: 24 tokens + EOS or a cut). With ``--run`` a
trained run is also measured as it is used (``natural``: its production DecodeCfg, captions end at EOS), on its
cached features when available.

Each repeat times one ``decode()`` call per mode, features → tokens (encoder included, no backbone); the modes are
interleaved and alternate their order so a drifting machine load hits both. Warm-up calls are not timed.

``--runtime onnxruntime`` runs both modes as exported FP32 graphs on ONNX Runtime (one thread per ``--threads``)
instead of torch eager: the cached encoder + step graphs of the model's export spec against the graphs of
:class:`~edgecap.workshop.torch_runtime.prefix.PrefixRerunModel`, which re-run the prefix every step as the official
ExpansionNet
ONNX export does. In torch eager at batch 1 both modes are bound by per-op dispatch, which hides what the cache
saves; ONNX Runtime shows it.

Usage::

    python -m research.decode_cache --model acort-xsmall --model ort-xsmall --beam 3 --steps 25 --batch 1 --batch 8
    python -m research.decode_cache --run ~/.edgecap/runs/acort-xsmall --json decode_cache.json
    python -m research.decode_cache --model expansionnet-v2 --runtime torch --runtime onnxruntime \\
        --steps 20 --threads 1
"""

from __future__ import annotations

import contextlib
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np
import torch
from torch import nn

from edgecap.runtime.backends.registry import canonical_runtime
from edgecap.runtime.decoding import DecodeCfg, Hypothesis, State, decode
from edgecap.workshop.torch_runtime.prefix import PrefixRerunModel, PrefixRerunStepModel
from edgecap.workshop.torch_runtime.runtime import TorchStepModel
from tools.random_models import Setup, random_setup, torch_environment

MODES = ("cached", "prefix")
RUNTIMES = ("torch", "onnxruntime")


@dataclass(frozen=True)
class BenchCase:
    """One row of the report.

    Attributes:
        model: registered model name (random-init weights at edge settings); ignored when ``run`` is given.
        batch: images per ``decode()`` call.
        beam: beam size K (1 = greedy).
        steps: forced decode steps (``max_len``; ``min_len = steps - 1``); ignored when ``natural``.
        warmup: untimed calls per mode before timing.
        repeats: timed calls per mode.
        run: a trained run directory or name (``edgecap.workshop.runs.load_run``).
        natural: decode the run with its production DecodeCfg (EOS ends captions) instead of forcing ``steps``.
        features: a feature cache directory for the run's inputs (default: the one recorded in the run's config).
        seed: seed of the random weights and features.
        runtime: ``"torch"`` (eager) or ``"onnxruntime"`` (exported FP32 graphs on ONNX Runtime, CPU).
    """

    model: str = "acort-xsmall"
    batch: int = 1
    beam: int = 3
    steps: int = 25
    warmup: int = 3
    repeats: int = 20
    run: str | None = None
    natural: bool = False
    features: str | None = None
    seed: int = 0
    runtime: str = "torch"

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ValueError(f"BenchCase.runtime must be one of {RUNTIMES}, got {self.runtime!r}")
        for name in ("batch", "beam", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"BenchCase.{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"BenchCase.warmup must be >= 0, got {self.warmup}")
        if self.steps < 2:
            raise ValueError(f"BenchCase.steps must be >= 2 (min_len = steps - 1 >= 1), got {self.steps}")
        if self.natural and self.run is None:
            raise ValueError("BenchCase.natural needs a trained run (random weights have no natural caption length)")


class _Counting:
    """Forwards a StepModel and counts ``step`` calls and rows; the cost (one Python call) is the same in both modes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.steps = 0
        self.rows = 0

    def encode(self, inputs: Mapping[str, Any]) -> State:
        self.steps = self.rows = 0
        return self.inner.encode(inputs)

    def step(self, tokens: np.ndarray, state: State) -> tuple[Any, State]:
        self.steps += 1
        self.rows += int(tokens.shape[0])
        return self.inner.step(tokens, state)

    def select(self, state: State, index: np.ndarray) -> State:
        return self.inner.select(state, index)


def run_setup(case: BenchCase) -> Setup:
    """A trained run, its production DecodeCfg, and ``repeats`` batches of its cached features (random if none)."""
    from edgecap.runtime.captioning import decode_cfg_for
    from edgecap.workshop.runs import load_run

    run = load_run(case.run)
    decode_cfg = decode_cfg_for(run.vocab, beam_size=case.beam, max_words=run.max_words)
    feature_dir = case.features or run.config.get("features")
    if feature_dir and Path(feature_dir, "meta.json").is_file():
        from edgecap.workshop.data.feature_cache import FeatureCache
        from edgecap.workshop.training.batches import FeatureBank

        cache = FeatureCache(feature_dir)
        ids = cache.ids()
        wanted = [ids[i % len(ids)] for i in range(case.batch * case.repeats)]
        unique = list(dict.fromkeys(wanted))
        bank = FeatureBank(cache, unique)
        row_of = {image_id: row for row, image_id in enumerate(unique)}
        batches = [
            bank.batch([row_of[i] for i in wanted[r * case.batch : (r + 1) * case.batch]]).as_inputs()
            for r in range(case.repeats)
        ]
        source = f"trained run {run.path}, cached features"
    else:
        if case.features:
            raise FileNotFoundError(f"--features {case.features}: no feature cache there (missing meta.json)")
        batches = random_setup(run.config["model"]["name"], case.batch, case.seed).batches
        source = f"trained run {run.path}, random features"
    return Setup(run.model, decode_cfg, batches, run.config["model"]["name"], source)


# -- measuring ---------------------------------------------------------------------------------------------------------
def _tokens(result: list[list[Hypothesis]]) -> list[list[int]]:
    return [hyps[0].tokens if hyps else [] for hyps in result]


def _stats(times: list[float], batch: int) -> dict[str, Any]:
    ordered = sorted(times)
    median = statistics.median(ordered)
    p90 = ordered[min(len(ordered) - 1, max(0, round(0.9 * (len(ordered) - 1))))]
    return {
        "times_s": times,
        "median_s": median,
        "p90_s": p90,
        "median_ms_per_caption": 1e3 * median / batch,
        "p90_ms_per_caption": 1e3 * p90 / batch,
    }


def run_case(case: BenchCase, on_call: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time cached vs prefix re-run decoding for ``case``; ``on_call(mode)`` runs before every decode call."""
    setup = run_setup(case) if case.run is not None else random_setup(case.model, case.batch, case.seed)
    model = setup.model
    strategy = "beam" if case.beam > 1 else "greedy"
    cfg = setup.decode_cfg.replace(strategy=strategy, beam_size=case.beam, n_best=1)
    if not case.natural:
        cfg = cfg.replace(max_len=case.steps, min_len=case.steps - 1)
    if cfg.max_len > model.max_len:  # step t feeds the decoder t + 1 tokens (BOS first)
        raise ValueError(
            f"{setup.name} has {model.max_len} decoder positions; it cannot decode {cfg.max_len} steps "
            f"(lower --steps to <= {model.max_len})"
        )
    with contextlib.ExitStack() as stack:
        step_models = {m: _Counting(sm) for m, sm in _step_models(model, case.runtime, stack).items()}
        return _measure(case, setup, cfg, step_models, on_call)


def _step_models(model: nn.Module, runtime: str, stack: contextlib.ExitStack) -> dict[str, Any]:
    """The cached and the re-run-prefix step model of ``model`` on ``runtime`` (ONNX Runtime sessions entered on
    ``stack``)."""
    if runtime == "torch":
        return {"cached": TorchStepModel(model), "prefix": PrefixRerunStepModel(model)}
    from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model
    from edgecap.workshop.export import export_onnx

    threads = torch.get_num_threads()
    out = {}
    for mode, exported in (("cached", model), ("prefix", PrefixRerunModel(model))):
        graphs = export_onnx(exported.eval(), None, precisions=["fp32"], parity=False).runtime_models("fp32")
        ort_model = create_onnxruntime_step_model(
            graphs["encoder"], graphs["step"], intra_op_threads=threads, inter_op_threads=1
        )
        out[mode] = stack.enter_context(ort_model)
    return out


def _measure(
    case: BenchCase,
    setup: Setup,
    cfg: DecodeCfg,
    step_models: Mapping[str, _Counting],
    on_call: Callable[[str], None] | None,
) -> dict[str, Any]:
    """Interleaved timed decodes of both modes (see the module docstring)."""
    batches = setup.batches
    times: dict[str, list[float]] = {m: [] for m in MODES}
    steps: dict[str, list[int]] = {m: [] for m in MODES}
    rows: dict[str, list[int]] = {m: [] for m in MODES}
    tokens: dict[str, list[list[list[int]]]] = {m: [] for m in MODES}
    for i in range(case.warmup + case.repeats):
        inputs = batches[max(0, i - case.warmup) % len(batches)]
        order = MODES if i % 2 == 0 else MODES[::-1]
        for mode in order:
            if on_call is not None:
                on_call(mode)
            counted = step_models[mode]
            start = time.perf_counter()
            result = decode(counted, inputs, cfg)
            elapsed = time.perf_counter() - start
            if i >= case.warmup:
                times[mode].append(elapsed)
                steps[mode].append(counted.steps)
                rows[mode].append(counted.rows)
                tokens[mode].append(_tokens(result))

    out: dict[str, Any] = {
        "name": setup.name,
        "runtime": case.runtime,
        "weights": setup.weights,
        "setting": "natural" if case.natural else "forced",
        "case": asdict(case),
        "decode_cfg": cfg.to_dict(),
        "decode_steps": statistics.mean(steps["cached"]),
        "hypothesis_steps": statistics.mean(rows["cached"]),
        "same_tokens": tokens["cached"] == tokens["prefix"],
        "mean_tokens_per_caption": statistics.mean(len(t) for batch in tokens["cached"] for t in batch),
    }
    for mode in MODES:
        out[mode] = {**_stats(times[mode], case.batch), "decode_steps": statistics.mean(steps[mode])}
    out["speedup"] = out["prefix"]["median_s"] / out["cached"]["median_s"]
    return out


# -- reporting -------------------------------------------------------------------------------------------------------
def _fmt_steps(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def markdown_table(results: Sequence[Mapping[str, Any]]) -> str:
    """One row per case: cached vs re-run ms per caption (median / p90) and the speed-up of the medians."""
    lines = [
        "| model | weights | runtime | setting | batch | beam | decode steps | cached ms/caption (median / p90) "
        "| re-run prefix ms/caption (median / p90) | speed-up | same tokens |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        c, p = r["cached"], r["prefix"]
        lines.append(
            f"| {r['name']} | {r['weights']} | {r.get('runtime', 'torch')} | {r['setting']} | {r['case']['batch']} "
            f"| {r['case']['beam']} "
            f"| {_fmt_steps(r['decode_steps'])} "
            f"| {c['median_ms_per_caption']:.1f} / {c['p90_ms_per_caption']:.1f} "
            f"| {p['median_ms_per_caption']:.1f} / {p['p90_ms_per_caption']:.1f} "
            f"| {r['speedup']:.2f}x | {'yes' if r['same_tokens'] else 'NO'} |"
        )
    return "\n".join(lines)


def execute(args: SimpleNamespace) -> int:
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    common = {"beam": args.beam, "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats}
    cases = []
    for runtime in args.runtime or ["torch"]:
        for batch in args.batch or [1]:
            case_args = {**common, "batch": batch, "runtime": runtime}
            if args.run:
                for natural in (False, True):
                    cases.append(BenchCase(run=args.run, natural=natural, features=args.features, **case_args))
            for name in args.model or ([] if args.run else ["acort-xsmall", "ort-xsmall"]):
                cases.append(BenchCase(model=name, seed=args.seed, **case_args))

    env_before = torch_environment()
    results = []
    for case in cases:
        label = case.run or case.model
        print(
            f"... {label} {case.runtime} batch {case.batch} beam {case.beam} "
            f"({'natural' if case.natural else 'forced'})",
            file=sys.stderr,
            flush=True,
        )
        try:
            results.append(run_case(case))
        except (ValueError, FileNotFoundError) as exc:  # bad flags or run: a message, not a traceback
            raise SystemExit(f"error: {exc}") from exc
    env = {**env_before, "loadavg_after": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}

    command = shlex.join(["python", "research/decode_cache.py", *sys.argv[1:]])
    print(markdown_table(results))
    print(
        f"\ncommand: `{command}`\ntorch {env['torch']}, {env['torch_threads']} threads, CPU {env['cpu']} "
        f"({env['cpu_count']} logical), load average before {env['loadavg']}, after {env['loadavg_after']}"
    )
    if args.json:
        from tools.files import write_json

        write_json(args.json, {"command": command, "environment": env, "results": results})
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _runtimes(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """``--runtime`` values by their current names: earlier spellings (ort) still work, recorded commands use them."""
    names = tuple(canonical_runtime(v) for v in values)
    for name in names:
        if name not in RUNTIMES:
            raise click.BadParameter(f"{name!r} is not one of {', '.join(RUNTIMES)}")
    return names


@click.command(help=__doc__.split("\n\n")[0])
@click.option(
    "--model", multiple=True, help="registered model, random init (repeatable; default: acort-xsmall and ort-xsmall)"
)
@click.option("--run", help="a trained run (directory or name): measured forced and natural, on its features")
@click.option("--features", help="feature cache for --run (default: the one in the run's config)")
@click.option("--batch", type=int, multiple=True, help="images per decode call (repeatable; default 1)")
@click.option("--beam", type=int, default=3, help="beam size (1 = greedy); default 3", show_default=True)
@click.option(
    "--steps", type=int, default=25, help="forced decode steps: max_len, min_len = steps - 1 (25)", show_default=True
)
@click.option("--warmup", type=int, default=3, help="untimed decode calls per mode (3)", show_default=True)
@click.option("--repeats", type=int, default=20, help="timed decode calls per mode (20)", show_default=True)
@click.option(
    "--runtime",
    multiple=True,
    callback=_runtimes,
    help="torch (eager, default) or onnxruntime (exported FP32 graphs on ONNX Runtime; 'ort' also accepted); "
    "repeatable",
)
@click.option("--threads", type=int, help="torch.set_num_threads and ONNX Runtime intra-op threads (default: torch's)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--json", type=click.Path(path_type=Path), help="also write the full report (every timing) to this JSON file"
)
def main(**options: Any) -> None:
    # repeatable options come as tuples: a list, or None when not given (execute sets the defaults)
    args = SimpleNamespace(**{k: list(v) or None if isinstance(v, tuple) else v for k, v in options.items()})
    sys.exit(execute(args))


if __name__ == "__main__":
    main()
