"""The decoding search's own per-step cost, apart from the model: where a small captioner's beam search spends time.

A decode call is ``encode`` + ``max_len`` × (``step`` + ``select``) inside the step model, plus the search code around
them (processors, top-k, bookkeeping of finished hypotheses, Python). For a small decoder on ONNX Runtime the last
part is a visible share of the total, and it is the same for every backend. This script measures it:

- ``trivial``: a step model that returns precomputed numpy log-probs (what ONNX Runtime returns), so (almost) all
  the time is the search's;
- ``torch``: :class:`~edgecap.workshop.torch_runtime.runtime.TorchStepModel` (cached, torch eager; its conversions at
the step
  boundary — numpy tokens/indices to tensors, log-probs to numpy — count as step/select time, not search);
- ``onnxruntime``: the exported FP32 graphs on ONNX Runtime (CPU) via ``create_onnxruntime_step_model``;
- ``prefix``: :class:`~edgecap.workshop.torch_runtime.prefix.PrefixRerunStepModel` (no cache: re-runs the prefix every
step).

Every step-model call is timed through :class:`~edgecap.bench.harness.TimedStepModel`; the *search overhead* of a
call is its wall time minus the time inside ``encode``/``step``/``select``. Models are random-init at edge settings
(``acort-xsmall``: 1280-d features, 49 regions, radix 771 classes); the setting is *forced*: ``min_len = steps − 1``,
``max_len = steps``, so every hypothesis runs every step. Repeats interleave backends and implementations (and
alternate their order) so a drifting load on a shared machine hits all of them; medians are reported.

``--impl`` names importable modules exposing ``decode`` (default ``edgecap.runtime.decoding``), e.g. a saved copy of an
older
search, to compare implementations in one process; their results must agree token for token.

Usage::

    python -m research.decode_overhead --batch 1 --batch 8 --beam 3 --steps 20 --backend trivial --backend onnxruntime
    python -m research.decode_overhead --backend trivial --profile cprofile
    # host search ms/step before/after the vectorised beam search, at a large batch, EOS from step 10-20 on:
    python -m research.decode_overhead --backend trivial --eos late --steps 26 --batch 1024 \
        --repeats 5 --impl decode_overhead:per_image_beam_search --impl edgecap.runtime.decoding
"""

from __future__ import annotations

import cProfile
import importlib
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np
import torch
from torch import Tensor

from edgecap.bench.harness import TimedStepModel
from edgecap.runtime.backends.registry import canonical_runtime
from edgecap.runtime.decoding import DecodeCfg, RadixSpec, State
from edgecap.workshop.models import EDGE_WORD_VOCAB_SIZE, create_model, edge_settings, get_model_cfg
from tools.files import write_json

BACKENDS = ("trivial", "torch", "onnxruntime", "prefix")
#: --eos mode -> the trivial backend's EOS schedule (PrecomputedStepModel ``eos``).
TABLE_EOS = {"forced": "table", "late": "late", "never": "never"}
GRID = 7  # EfficientNet-Lite0 at 224 px: a 7 x 7 grid of 1280-d features


class PrecomputedStepModel:
    """A step model whose ``step`` costs next to nothing: it returns a slice of numpy log-probs drawn once up front.

    Step ``t`` returns the first ``rows`` rows (rows = the tokens fed) of table ``t mod tables`` (softmaxed random
    logits), so the search sees fresh distributions from step to step and the beams evolve as with a real model;
    ``select`` gathers a one-column numpy state (as ONNX Runtime's adapter does). Wide batches × vocabularies cycle
    through fewer tables (``max_bytes``) so the tables fit in memory.

    ``eos`` sets EOS's log-prob per row and step (written into the table's EOS column before it is returned):
    ``"table"`` leaves the drawn value; ``"late"`` makes EOS likely from a per-row step drawn in [10, 20) on
    (log-sigmoid ramp), so hypotheses finish at many different steps as with a trained captioner; ``"never"`` keeps
    it at -30, so EOS never ranks among the candidates and every step takes the search's common path.
    """

    def __init__(
        self,
        rows: int,
        vocab_size: int,
        steps: int,
        seed: int = 0,
        eos: str = "table",
        eos_id: int | None = None,
        max_bytes: int = 1 << 30,
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        tables = max(1, min(steps, max_bytes // max(1, rows * vocab_size * 4)))
        self.table = [
            torch.log_softmax(torch.randn(rows, vocab_size, generator=g) * 3, dim=-1).numpy() for _ in range(tables)
        ]
        self.eos_id = eos_id
        self.eos_lp: list[np.ndarray] | None = None
        if eos == "late":
            start = torch.randint(10, 20, (rows,), generator=g).numpy()
            self.eos_lp = [-np.logaddexp(0.0, -1.5 * (t - start)).astype(np.float32) for t in range(steps)]
        elif eos == "never":
            self.eos_lp = [np.full(rows, -30.0, dtype=np.float32)] * steps
        elif eos != "table":
            raise ValueError(f"unknown eos mode {eos!r}")
        if self.eos_lp is not None and eos_id is None:
            raise ValueError("eos_id is required to set EOS's log-probs")
        self._t = 0

    def encode(self, inputs: Mapping[str, Any]) -> State:
        self._t = 0
        return {"h": np.zeros((inputs["features"].shape[0], 1), dtype=np.float32)}

    def step(self, tokens: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        rows = tokens.shape[0]
        lp = self.table[self._t % len(self.table)][:rows]
        if self.eos_lp is not None:
            lp[:, self.eos_id] = self.eos_lp[self._t][:rows]
        self._t += 1
        return lp, state

    def select(self, state: State, index: np.ndarray) -> State:
        return {k: np.take(v, index, axis=0) for k, v in state.items()}


def per_image_beam_search(step_model: Any, inputs: Any, cfg: Any, processors: Any = None) -> Any:
    """``decode`` with the beam search held on its per-image path at every batch size (``beam.SMALL_BATCH``): the
    search as it was before the vectorised path, for ``--impl decode_overhead:per_image_beam_search``."""
    from edgecap.runtime.decoding import beam, decode

    previous, beam.SMALL_BATCH = beam.SMALL_BATCH, 10**9
    try:
        return decode(step_model, inputs, cfg, processors)
    finally:
        beam.SMALL_BATCH = previous


def load_impl(name: str) -> Callable[..., Any]:
    """``module`` (its ``decode``) or ``module:function``."""
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function or "decode")


def edge_setup(name: str, batch: int, seed: int) -> tuple[torch.nn.Module, DecodeCfg, dict[str, Tensor]]:
    """Random-init ``name`` at edge settings, its DecodeCfg (radix: 120 words + ``<unk>`` in one base-768 digit) and
    one input batch (ReLU6-like features on a 7 × 7 grid)."""
    torch.manual_seed(seed)
    settings = edge_settings(name)
    model = create_model(name, **settings).eval()
    cfg = get_model_cfg(name)
    if cfg.vocab_kind == "radix":
        base = cfg.radix_base
        decode_cfg = DecodeCfg(
            pad_id=0, bos_id=base + 1, eos_id=base + 2, radix=RadixSpec(base, 1, EDGE_WORD_VOCAB_SIZE - 3)
        )
    else:
        decode_cfg = DecodeCfg(pad_id=0, bos_id=1, eos_id=2)
    g = torch.Generator().manual_seed(seed)
    regions = GRID * GRID
    features = torch.randn(batch, regions, settings["feature_dim"], generator=g).clamp_(0, 6)
    cells = torch.arange(GRID, dtype=torch.float32) / GRID
    y, x = torch.meshgrid(cells, cells, indexing="ij")
    boxes = torch.stack([x, y, x + 1 / GRID, y + 1 / GRID], dim=-1).reshape(1, regions, 4).expand(batch, -1, -1)
    inputs = {"features": features, "boxes": boxes.contiguous(), "feature_mask": torch.ones(batch, regions, dtype=bool)}
    return model, decode_cfg, inputs


class Backends:
    """Builds each backend's step model once per batch size (the ONNX Runtime export once per process)."""

    def __init__(
        self,
        model_name: str,
        seed: int,
        onnxruntime_threads: int,
        device: str = "cpu",
        fp16: bool = False,
        eos: str = "table",
        vocab: int | None = None,
    ) -> None:
        self.model_name, self.seed, self.onnxruntime_threads = model_name, seed, onnxruntime_threads
        self.eos, self.vocab = eos, vocab
        self.device, self.dtype = device, (torch.float16 if fp16 else None)
        self._ort: Any = None

    def build(self, backend: str, model: torch.nn.Module, cfg: DecodeCfg, batch: int) -> Any:
        if backend == "trivial":
            vocab = self.vocab or model.vocab_size
            return PrecomputedStepModel(batch * cfg.beam_size, vocab, cfg.max_len, self.seed, self.eos, cfg.eos_id)
        if backend == "torch":
            from edgecap.workshop.torch_runtime.runtime import TorchStepModel

            return TorchStepModel(model, self.device, dtype=self.dtype)
        if backend == "prefix":
            from edgecap.workshop.torch_runtime.prefix import PrefixRerunStepModel

            return PrefixRerunStepModel(model, self.device, dtype=self.dtype)
        if backend == "onnxruntime":
            if self._ort is None:
                from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model
                from edgecap.workshop.export import export_onnx

                result = export_onnx(model, None, precisions=["fp32"])
                self._ort = create_onnxruntime_step_model(
                    **result.runtime_models("fp32"),
                    intra_op_threads=self.onnxruntime_threads,
                    session_config={"session.intra_op.allow_spinning": "0"},
                )
                self._ort.__enter__()
            return self._ort
        raise ValueError(f"unknown backend {backend!r}; known: {BACKENDS}")

    def close(self) -> None:
        if self._ort is not None:
            self._ort.__exit__(None, None, None)


def _tokens(result: Sequence[Sequence[Any]]) -> list[list[list[int]]]:
    return [[h.tokens for h in hyps] for hyps in result]


def _scores(result: Sequence[Sequence[Any]]) -> list[list[float]]:
    return [[h.score for h in hyps] for hyps in result]


def measure(
    backends: Sequence[str],
    impls: Mapping[str, Callable[..., Any]],
    batch: int,
    cfg: DecodeCfg,
    inputs: dict[str, Tensor],
    builder: Backends,
    model: torch.nn.Module,
    warmup: int,
    repeats: int,
) -> list[dict[str, Any]]:
    """Time every (backend, implementation) pair ``repeats`` times, interleaved; one summary row per pair.

    On CUDA every step-model call ends with a device synchronisation, so the time inside calls covers their kernels
    and the rest of the wall time is the search's own."""
    sync = torch.cuda.synchronize if builder.device.startswith("cuda") else None
    timed = {b: TimedStepModel(builder.build(b, model, cfg, batch), sync=sync) for b in backends}
    pairs = [(b, i) for b in backends for i in impls]
    samples: dict[tuple[str, str], list[dict[str, float]]] = {p: [] for p in pairs}
    outputs: dict[tuple[str, str], Any] = {}
    for r in range(warmup + repeats):
        for backend, impl in pairs if r % 2 == 0 else pairs[::-1]:
            sm = timed[backend]
            sm.reset()
            start = time.perf_counter()
            result = impls[impl](sm, inputs, cfg)
            wall = time.perf_counter() - start
            t = sm.times()
            outputs.setdefault((backend, impl), result)
            if r >= warmup:
                inside = t.encode_s + t.step_s + t.select_s
                samples[(backend, impl)].append(
                    {
                        "wall": wall,
                        "encode": t.encode_s,
                        "step": t.step_s,
                        "select": t.select_s,
                        "search": wall - inside,
                        "steps": t.steps,
                    }
                )
    rows = []
    for backend, impl in pairs:
        s = samples[(backend, impl)]
        steps = s[0]["steps"]

        def med(key: str, s: list[dict[str, float]] = s) -> float:
            return statistics.median(x[key] for x in s)

        reference = outputs[(backend, next(iter(impls)))]
        same = _tokens(outputs[(backend, impl)]) == _tokens(reference)
        same_scores = _scores(outputs[(backend, impl)]) == _scores(reference)
        rows.append(
            {
                "backend": backend,
                "impl": impl,
                "batch": batch,
                "steps": steps,
                "ms_per_image": 1e3 * med("wall") / batch,
                "encode_ms": 1e3 * med("encode"),
                "step_ms": 1e3 * med("step"),
                "select_ms": 1e3 * med("select"),
                "search_ms": 1e3 * med("search"),
                "search_us_per_step": 1e6 * med("search") / steps,
                "search_us_per_step_min": 1e6 * min(x["search"] for x in s) / steps,
                "search_us_per_step_max": 1e6 * max(x["search"] for x in s) / steps,
                "same_as_first_impl": same and same_scores,
            }
        )
    return rows


def profile(backend: str, impl: Callable[..., Any], sm: Any, inputs: dict[str, Tensor], cfg: DecodeCfg, n: int) -> str:
    """cProfile of ``n`` decode calls (after one warm-up), top functions by internal time."""
    impl(sm, inputs, cfg)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        impl(sm, inputs, cfg)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    return f"== cProfile, {backend}, {n} calls ==\n{out.getvalue()}"


def torch_profile(backend: str, impl: Callable[..., Any], sm: Any, inputs: dict[str, Tensor], cfg: DecodeCfg) -> str:
    """torch.profiler op table of one decode call (after one warm-up)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    impl(sm, inputs, cfg)
    with tprofile(activities=[ProfilerActivity.CPU]) as prof:
        impl(sm, inputs, cfg)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    return f"== torch.profiler, {backend} ==\n{table}"


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "| backend | impl | batch | steps | ms/image | encode ms | step ms | select ms | search ms | search µs/step "
        "| (min–max) | same result |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['impl']} | {r['batch']} | {r['steps']} | {r['ms_per_image']:.2f} "
            f"| {r['encode_ms']:.2f} | {r['step_ms']:.2f} | {r['select_ms']:.2f} | {r['search_ms']:.2f} "
            f"| {r['search_us_per_step']:.0f} | {r['search_us_per_step_min']:.0f}–{r['search_us_per_step_max']:.0f} "
            f"| {r['same_as_first_impl']} |"
        )
    return "\n".join(lines)


def ratios(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Search µs/step of the first impl over each other impl; torch-eager / ONNX Runtime and re-run prefix / cached, per
    (impl, batch), from the median ms/image."""
    by = {(r["backend"], r["impl"], r["batch"]): r["ms_per_image"] for r in rows}
    search = {(r["backend"], r["impl"], r["batch"]): r["search_us_per_step"] for r in rows}
    first_impl = rows[0]["impl"] if rows else None
    out = [
        f"{backend} batch {batch}: search/step {first_impl} / {impl} = {search[(backend, first_impl, batch)] / us:.2f}x"
        for (backend, impl, batch), us in search.items()
        if impl != first_impl and (backend, first_impl, batch) in search
    ]
    for (backend, impl, batch), ms in by.items():
        if backend != "torch":
            continue
        if ("onnxruntime", impl, batch) in by:
            out.append(
                f"{impl} batch {batch}: torch eager / ONNX Runtime = {ms / by[('onnxruntime', impl, batch)]:.2f}x"
            )
        if ("prefix", impl, batch) in by:
            out.append(f"{impl} batch {batch}: re-run prefix / cached = {by[('prefix', impl, batch)] / ms:.2f}x")
    return out


def _backends(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """``--backend`` values by their current names (earlier spellings, ort, still work)."""
    names = tuple(canonical_runtime(v) for v in values)
    for name in names:
        if name not in BACKENDS:
            raise click.BadParameter(f"{name!r} is not one of {', '.join(BACKENDS)}")
    return names


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--model", default="acort-xsmall", show_default=True)
@click.option("--batch", type=int, multiple=True, help="images per decode call (repeatable; default 1 and 8)")
@click.option("--beam", type=int, default=3, show_default=True)
@click.option(
    "--steps", type=int, default=20, help="forced decode steps: max_len = steps, min_len = steps - 1", show_default=True
)
@click.option("--backend", multiple=True, callback=_backends, help="repeatable; default all")
@click.option(
    "--impl",
    multiple=True,
    help="module exposing decode(), or module:function with decode's signature (repeatable; default "
    "edgecap.runtime.decoding), e.g. decode_overhead:per_image_beam_search for the search before vectorising",
)
@click.option(
    "--eos",
    type=click.Choice(tuple(TABLE_EOS)),
    default="forced",
    help="forced: min_len = steps - 1, EOS only at the last step; late (trivial backend): EOS likely from a "
    "per-row step in [10, 20) on; never (trivial backend): EOS never ranks, every step takes the common path",
    show_default=True,
)
@click.option(
    "--vocab",
    type=int,
    help="trivial backend: vocabulary size (default the model's; other sizes "
    "decode a word vocabulary without the radix constraint)",
)
@click.option("--warmup", type=int, default=3, show_default=True)
@click.option("--repeats", type=int, default=20, show_default=True)
@click.option(
    "--threads", type=int, default=1, help="torch intra-op threads and ONNX Runtime intra_op_threads", show_default=True
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--profile", type=click.Choice(("cprofile", "torch")), help="print a profile of each backend (first impl)"
)
@click.option("--json", type=click.Path(path_type=Path), help="write the rows here")
@click.option(
    "--device", default="cpu", help="torch device of the torch and prefix backends (cpu, cuda)", show_default=True
)
@click.option("--fp16", is_flag=True, help="cast the torch model to float16 (CUDA)")
def main(**options: Any) -> None:
    # repeatable options come as tuples: a list, or None when not given (the defaults are set below)
    args = SimpleNamespace(**{k: list(v) or None if isinstance(v, tuple) else v for k, v in options.items()})
    if args.steps < 2:
        raise click.UsageError("--steps must be >= 2")

    torch.set_num_threads(args.threads)
    impls = {name: load_impl(name) for name in (args.impl or ["edgecap.runtime.decoding"])}
    backends = list(args.backend) if args.backend else list(BACKENDS)
    if args.vocab is not None and backends != ["trivial"]:
        raise click.UsageError("--vocab applies to the trivial backend only")
    builder = Backends(args.model, args.seed, args.threads, args.device, args.fp16, TABLE_EOS[args.eos], args.vocab)
    print(f"load: {os.getloadavg()}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    try:
        for batch in args.batch or [1, 8]:
            model, base_cfg, inputs = edge_setup(args.model, batch, args.seed)
            strategy = "beam" if args.beam > 1 else "greedy"
            if args.vocab is not None and args.vocab != model.vocab_size:  # a word vocabulary of that size
                base_cfg = DecodeCfg(pad_id=0, bos_id=1, eos_id=2)
            min_len = args.steps - 1 if args.eos == "forced" else 0
            cfg = base_cfg.replace(strategy=strategy, beam_size=args.beam, max_len=args.steps, min_len=min_len)
            if args.profile:
                first = next(iter(impls.values()))
                for backend in backends:
                    sm = builder.build(backend, model, cfg, batch)
                    if args.profile == "cprofile":
                        print(profile(backend, first, sm, inputs, cfg, 20))
                    else:
                        print(torch_profile(backend, first, sm, inputs, cfg))
                continue
            rows += measure(backends, impls, batch, cfg, inputs, builder, model, args.warmup, args.repeats)
    finally:
        builder.close()
    print(f"load: {os.getloadavg()}", file=sys.stderr)
    if rows:
        print(markdown(rows))
        for line in ratios(rows):
            print(line)
        if args.json is not None:
            write_json(args.json, {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows})


if __name__ == "__main__":
    main()
