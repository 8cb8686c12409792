"""The measurement driver: every bundle × runtime × precision × beam × batch (× length level) combination of a
:class:`BenchCfg`.

Order of work (``docs/bench-report-schema.md`` describes every number):

1. in this process: capture the environment, open and verify each bundle, resolve the quality subset and the input
   pool, and list the combinations that cannot exist here (``skipped``, with the reason);
2. per bundle × runtime × precision (a *group*): by default in a fresh Python process (``BenchCfg.isolate``;
   ``python -m edgecap.bench.run``), so a group's memory is its own and a crash or out-of-memory kill in one group
   is recorded as an error and the run goes on. In the group: load the bundle on the runtime (timed: ``load_s``),
   prepare the inputs (untimed), then per beam and length level a quality run (untimed, separate from the timing as
   MLPerf requires) and per batch a timing run: warm-up, then the duration-based loop of
   :func:`~edgecap.bench.harness.run_loop`, with the step model wrapped in
   :class:`~edgecap.bench.harness.TimedStepModel` (:class:`~edgecap.bench.harness.TimedRefineModel` for mask-predict)
   for the encoder/decoder split and the memory high-water marks reset before it;
3. link the results: speed-up against the prefix re-run baseline, quality delta against FP32.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgecap._process import terminate
from edgecap.bench import harness
from edgecap.bench.harness import LatencyStats, LoopCfg, StepTimes, run_loop, timed_decoder
from edgecap.bench.report import (
    SCHEMA_VERSION,
    BenchReport,
    Breakdown,
    BundleInfo,
    ComboResult,
    LoopInfo,
    Quality,
    SizeInfo,
    Skip,
    Throughput,
)
from edgecap.decoding.config import MAX_BEAM
from edgecap.length import NO_LENGTH_CONTROL, LengthLevelError
from edgecap.precisions import PRECISIONS
from edgecap.runtimes.threads import ThreadSettingError, check_threads

__all__ = ["PRECISIONS", "BenchCfg", "BenchCfgError", "link_results", "run_benchmark"]

RERUN = "torch-rerun"
#: ``BenchCfg.length_levels`` value meaning every level of each bundle's plan.
ALL_LEVELS = "all"


class BenchCfgError(ValueError):
    """An invalid benchmark configuration; the message names the field."""


@dataclass(frozen=True)
class BenchCfg:
    """What to benchmark and how.

    Attributes:
        bundles: bundle directories.
        runtimes: runtime registry names (``edgecap.runtimes.list_runtimes()``); ``torch-rerun`` is the re-run-prefix
            baseline; empty = every registered runtime. A registered runtime whose backend is not installed here is
            skipped with the reason.
        precisions: precisions to measure; None = every precision each bundle holds.
        batches: images per query; batch 1 is the single-stream scenario, larger ones the offline scenario.
        beams: beam sizes (1 = greedy, at most ``MAX_BEAM``); None = each bundle's default. Mask-predict bundles
            (LaBERT) decode one hypothesis and are measured at beam 1 only.
        length_levels: 1-based levels to measure length-controllable bundles (LaBERT, ``*-len``) at, or ``"all"``
            (each plan's every level); None = each one's default. Any for a bundle without length control is refused.
        images: a directory of images for the timing pool (bundles that caption images); None = synthetic inputs.
        synthetic: number of distinct synthetic inputs in the pool (when ``images`` is None).
        synthetic_regions: regions per synthetic input for bundles that caption region features.
        max_images: at most this many files of ``images`` (sorted) form the pool.
        quality: measure CIDEr-D on the quality subset when one is available.
        quality_data: dataset directory for quality; None = the bundle's training dataset when it is on this machine.
        quality_features: region-feature directory for ``quality_data`` (region-feature bundles).
        quality_images: size of the fixed quality subset (first N of the test split, else val).
        quality_batch: batch size of the quality run (it does not change the captions).
        warmup, min_repeats, min_seconds, max_repeats: the repeat rule (:class:`~edgecap.bench.harness.LoopCfg`).
        threads: ONNX Runtime's threading (``"auto"``/None, ``"dedicated"``, or an intra-op count, 0 = ORT's own
            default; :func:`edgecap.runtimes.threads.plan_threads`); a count >= 1 also sets torch's threads.
        spin: force ONNX Runtime's pool threads to spin (True) or not (False); None = the policy's choice.
        device: torch device (``cpu``, ``cuda``, ``cuda:1``); None = CUDA when available.
        providers: ONNX Runtime providers (``cpu``, ``cuda``, ``tensorrt``); None = the best available.
        isolate: run each bundle × runtime × precision in a fresh Python process (memory isolation).
        tegrastats: sample tegrastats (power, unified memory) when it is installed.
        step_mode: the torch runtime's decoder step (``eager``, ``static``, ``cuda-graph``, ``compile``, ``auto``).
        trt_opt_batch: images per call ONNX Runtime's TensorRT provider tunes its engines for; None = its default
            (``edgecap.runtimes.onnxruntime_gpu.DEFAULT_TRT_OPT_BATCH``, the largest of the default ``batches``).
        seed: seed of the synthetic inputs and of torch.
    """

    bundles: tuple[str, ...]
    runtimes: tuple[str, ...] = ()
    precisions: tuple[str, ...] | None = None
    batches: tuple[int, ...] = (1, 8)
    beams: tuple[int, ...] | None = None
    length_levels: tuple[int, ...] | str | None = None
    images: str | None = None
    synthetic: int = 32
    synthetic_regions: int = 36
    max_images: int = 64
    quality: bool = True
    quality_data: str | None = None
    quality_features: str | None = None
    quality_images: int = 100
    quality_batch: int = 16
    warmup: int = 3
    min_repeats: int = 10
    min_seconds: float = 2.0
    max_repeats: int = 10_000
    threads: int | str | None = None
    spin: bool | None = None
    device: str | None = None
    providers: tuple[str, ...] | None = None
    isolate: bool = True
    tegrastats: bool = True
    step_mode: str = "eager"
    trt_opt_batch: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        from edgecap.runtimes.registry import canonical_runtime, list_runtimes

        for name in ("bundles", "runtimes", "precisions", "batches", "beams", "providers"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                if isinstance(value, (str, Path)):
                    value = (value,)
                object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "bundles", tuple(str(b) for b in self.bundles))
        for name in ("images", "quality_data", "quality_features"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, str(getattr(self, name)))
        if not self.bundles:
            raise BenchCfgError("bundles: give at least one bundle directory")
        # empty = every registered runtime; an older name (an alias) is read as the runtime's current name
        runtimes = self.runtimes or tuple(list_runtimes())
        object.__setattr__(self, "runtimes", tuple(dict.fromkeys(canonical_runtime(r, warn=True) for r in runtimes)))
        unknown = [r for r in self.runtimes if r not in list_runtimes()]
        if unknown:
            raise BenchCfgError(f"runtimes: unknown {unknown}; registered: {list_runtimes()}")
        if self.precisions is not None:
            bad = [p for p in self.precisions if p not in PRECISIONS]
            if bad or not self.precisions:
                raise BenchCfgError(f"precisions: unknown {bad}; known: {list(PRECISIONS)}")
        for name in ("batches", "beams"):
            value = getattr(self, name)
            if value is None:
                continue
            if not value or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in value):
                raise BenchCfgError(f"{name}: need positive integers, got {list(value)}")
            object.__setattr__(self, name, tuple(dict.fromkeys(value)))  # dedupe, keep order
        for name, top, label in (("beams", MAX_BEAM, "MAX_BEAM"), ("batches", harness.MAX_BATCH, "MAX_BATCH")):
            if getattr(self, name) and max(getattr(self, name)) > top:  # a typo would allocate for hours
                raise BenchCfgError(f"{name}: at most {label} ({top}), got {max(getattr(self, name))}")
        if self.batches is None:
            raise BenchCfgError("batches: give at least one batch size")
        self._check_length_levels()
        for name in ("synthetic", "synthetic_regions", "max_images", "quality_batch"):
            if not 1 <= getattr(self, name) <= harness.MAX_SYNTHETIC:  # pool sizes
                raise BenchCfgError(f"{name} must be in 1..{harness.MAX_SYNTHETIC}, got {getattr(self, name)}")
        if self.quality_images < 0:
            raise BenchCfgError(f"quality_images must be >= 0, got {self.quality_images}")
        if self.trt_opt_batch is not None and (isinstance(self.trt_opt_batch, bool) or self.trt_opt_batch < 1):
            raise BenchCfgError(f"trt_opt_batch must be an integer >= 1 or None, got {self.trt_opt_batch!r}")
        try:
            check_threads(self.threads, self.spin)
        except ThreadSettingError as exc:
            raise BenchCfgError(str(exc)) from None
        try:
            self.loop()
        except ValueError as exc:
            raise BenchCfgError(str(exc)) from None

    def _check_length_levels(self) -> None:
        levels = self.length_levels
        if levels is None or levels == ALL_LEVELS:
            return
        if isinstance(levels, str) or not isinstance(levels, (tuple, list)):
            raise BenchCfgError(f"length_levels: give 1-based levels or {ALL_LEVELS!r}, got {levels!r}")
        if not levels or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in levels):
            raise BenchCfgError(f"length_levels: need 1-based levels (integers >= 1), got {list(levels)}")
        object.__setattr__(self, "length_levels", tuple(dict.fromkeys(levels)))

    def levels_for(self, bundle: Any) -> tuple[tuple[int | None, ...], list[str]]:
        """The levels to measure ``bundle`` at, and why any asked-for level is not (beyond its plan).

        ``(None,)`` for a bundle without length control: it is measured once at its own decoding (asking it for
        levels, ``"all"`` too, raises :class:`~edgecap.length.LengthLevelError`, before anything is measured).
        """
        plan = bundle.length_levels
        default = bundle.default_length_level
        if default is None:
            if self.length_levels is not None:  # refused up front, as `edgecap caption` does
                raise LengthLevelError(f"{bundle.path}: {NO_LENGTH_CONTROL}")
            return (None,), []
        if self.length_levels is None:
            return (default,), []
        if not plan:  # exported before bundles recorded their plan: levels as asked, "all" is unknowable
            if self.length_levels == ALL_LEVELS:
                return (default,), [f"length levels 'all': the bundle records no plan, measured at level {default}"]
            return tuple(self.length_levels), []
        if self.length_levels == ALL_LEVELS:
            return tuple(range(1, len(plan) + 1)), []
        kept = tuple(v for v in self.length_levels if v <= len(plan))
        dropped = [
            f"length level {v}: the bundle has levels 1..{len(plan)}" for v in self.length_levels if v > len(plan)
        ]
        return kept, dropped

    def loop(self) -> LoopCfg:
        """The repeat rule as a :class:`LoopCfg`."""
        return LoopCfg(self.warmup, self.min_repeats, float(self.min_seconds), self.max_repeats)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


# -- one group: a bundle on one runtime at one precision -------------------------------------------------------------
@dataclass(frozen=True)
class GroupTask:
    """Everything a worker process needs; plain data, picklable."""

    bundle: str
    model: str
    runtime: str
    precision: str
    beams: tuple[int, ...]
    cfg: BenchCfg
    image_paths: tuple[str, ...] | None
    quality_set: Any  # edgecap.bench.subjects.QualitySet | None
    levels: tuple[int | None, ...] = (None,)


@dataclass
class GroupOutcome:
    results: list[ComboResult] = field(default_factory=list)
    errors: list[Skip] = field(default_factory=list)


@dataclass(frozen=True)
class _Query:
    """One timed query's internals."""

    backbone_s: float | None
    steps: StepTimes
    images: int
    captions: int
    tokens: int
    words: int


Emit = Callable[[str, str], Any]  # (event, label): "start" before a unit of work, "done" after it


def _make_batches(items: Sequence[dict[str, Any]], batch: int) -> list[dict[str, Any]]:
    """Consecutive batches cycling through ``items`` (as many distinct batches as the pool allows, at least one)."""
    from edgecap.bench.subjects import collate

    count = max(1, len(items) // batch)
    return [collate([items[(k * batch + j) % len(items)] for j in range(batch)]) for k in range(count)]


def _quality(subject: Any, items: list[dict[str, Any]], quality_set: Any, decode_cfg: Any, batch: int) -> float:
    """CIDEr-D of the subject's captions on the quality set (not timed)."""
    from edgecap.bench.subjects import collate, inference_mode
    from edgecap.captioning import captions_from_hypotheses
    from edgecap.decoding import decode
    from edgecap.evaluation.cider import cider_d

    captions: list[str] = []
    with inference_mode():
        for start in range(0, len(items), batch):
            inputs = subject.to_inputs(collate(items[start : start + batch]))
            captions.extend(captions_from_hypotheses(subject.vocab, decode(subject.step_model, inputs, decode_cfg)))
    predictions = dict(zip(quality_set.image_ids, captions, strict=True))
    references = {i: list(refs) for i, refs in zip(quality_set.image_ids, quality_set.references, strict=True)}
    return cider_d(predictions, references)


def _timed_query(subject: Any, timed: Any, batches: list[dict[str, Any]], decode_cfg: Any) -> Callable:
    from edgecap.bench.subjects import inference_mode
    from edgecap.captioning import captions_from_hypotheses
    from edgecap.decoding import decode

    sync = subject.sync
    clock = timed.clock

    def query(i: int) -> _Query:
        batch = batches[i % len(batches)]
        timed.reset()
        with inference_mode():
            start = clock()
            inputs = subject.to_inputs(batch)
            backbone_s = None
            if subject.backbone_where == "torch":
                if sync is not None:
                    sync()
                backbone_s = clock() - start
            hypotheses = decode(timed, inputs, decode_cfg)
            captions = captions_from_hypotheses(subject.vocab, hypotheses)
        best = [h[0] for h in hypotheses if h]
        return _Query(
            backbone_s=backbone_s,
            steps=timed.times(),
            images=len(hypotheses),
            captions=len(captions),
            tokens=sum(len(h.tokens) + int(h.finished) for h in best),
            words=sum(len(c.split()) for c in captions),
        )

    return query


def _breakdown(times_s: Sequence[float], queries: Sequence[_Query], preprocess_s: float | None) -> Breakdown:
    n = len(queries)
    images = sum(q.images for q in queries) or 1
    backbone = [q.backbone_s for q in queries if q.backbone_s is not None]
    backbone_ms = 1e3 * sum(backbone) / n if backbone else None

    def per_chunk(read: Callable[[StepTimes], float]) -> float:
        """Summed over the queries, each query's total divided by its chunks: a batch split into concurrent chunks
        (one encode each) reports each phase as the mean over its chunks, which ran at the same time."""
        return sum(read(q.steps) / max(1, q.steps.encodes) for q in queries)

    encoder = 1e3 * per_chunk(lambda t: t.encode_s) / n
    decoder = 1e3 * per_chunk(lambda t: t.step_s) / n
    select = 1e3 * per_chunk(lambda t: t.select_s) / n
    calls = sum(q.steps.steps for q in queries)
    steps = per_chunk(lambda t: t.steps)
    first = [q.steps.first_step_s for q in queries if q.steps.first_step_s is not None]
    total = 1e3 * sum(times_s) / n
    return Breakdown(
        backbone_ms=backbone_ms,
        encoder_ms=encoder,
        decoder_ms=decoder,
        decoder_step_ms=1e3 * sum(q.steps.step_s for q in queries) / calls if calls else None,
        select_ms=select,
        search_overhead_ms=max(0.0, total - (backbone_ms or 0.0) - encoder - decoder - select),
        ttft_ms=(backbone_ms or 0.0) + encoder + 1e3 * sum(first) / len(first) if first else None,
        steps=steps / n,
        hypothesis_steps=sum(q.steps.step_rows for q in queries) / n,
        tokens_per_caption=sum(q.tokens for q in queries) / images,
        words_per_caption=sum(q.words for q in queries) / images,
        preprocess_ms_per_image=None if preprocess_s is None else 1e3 * preprocess_s,
    )


def measure_group(task: GroupTask, emit: Emit | None = None) -> GroupOutcome:
    """Load one bundle on one runtime/precision and measure every beam × batch (plus quality per beam).

    A failing combination becomes an error entry and the others still run; a failure to load fails the group.
    """
    from edgecap.bench.environment import jetson_model
    from edgecap.bench.memory import ResourceMonitor
    from edgecap.bench.subjects import open_subject
    from edgecap.bundle import load_bundle

    emit = emit or (lambda event, label: None)
    cfg = task.cfg
    bundle = load_bundle(task.bundle, verify=False, graphs="none")
    outcome = GroupOutcome()
    subject = open_subject(
        bundle,
        task.runtime,
        task.precision,
        device=cfg.device,
        threads=cfg.threads,
        spin=cfg.spin,
        providers=cfg.providers,
        step_mode=cfg.step_mode,
        trt_opt_batch=cfg.trt_opt_batch,
    )
    torch = sys.modules.get("torch")  # only where this subject brought torch in; Captioner.load leaves it alone
    if torch is not None:
        torch.manual_seed(cfg.seed)
        if isinstance(cfg.threads, int) and cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
    try:
        preprocess_s = None
        if task.image_paths is not None:
            pool, preprocess_s = subject.image_items(task.image_paths)
        else:
            pool = subject.synthetic_items(cfg.synthetic, cfg.seed, cfg.synthetic_regions)
        quality_items = None
        if task.quality_set is not None:
            qs = task.quality_set
            quality_items = (
                subject.feature_items(qs.features, qs.image_ids) if qs.features else subject.image_items(qs.paths)[0]
            )
        inputs = _TimedInputs(pool, preprocess_s)
        cuda = subject.device if subject.on_cuda else None
        with ResourceMonitor(cuda_device=cuda, unified=jetson_model() is not None, tegrastats=cfg.tegrastats) as mon:
            for beam, level in itertools.product(task.beams, task.levels):
                decode_cfg = subject.decode_cfg(beam, level)
                name = f"{task.model} {task.runtime} {task.precision} beam {beam}" + _level_label(level)
                quality = None
                if quality_items is not None:
                    emit("start", f"{name}: quality")
                    try:
                        score = _quality(subject, quality_items, task.quality_set, decode_cfg, cfg.quality_batch)
                        quality = Quality("CIDEr-D", score, len(quality_items), task.quality_set.description, beam)
                    except Exception as exc:  # recorded, the timing still runs
                        reason = f"quality{_level_label(level)}: {type(exc).__name__}: {exc}"
                        outcome.errors.append(_error(task, reason, beam))
                    emit("done", f"{name}: quality")
                for batch in cfg.batches:
                    emit("start", f"{name} batch {batch}")
                    try:
                        outcome.results.append(
                            _measure_combo(task, subject, mon, inputs, decode_cfg, beam, batch, quality)
                        )
                    except Exception as exc:  # e.g. out of memory at a large batch: record, go on
                        reason = f"{type(exc).__name__}: {exc}" + (f" (length level {level})" if level else "")
                        outcome.errors.append(_error(task, reason, beam, batch))
                    emit("done", f"{name} batch {batch}")
    finally:
        subject.close()
    return outcome


def _level_label(level: int | None) -> str:
    return "" if level is None else f" level {level}"


def _error(task: GroupTask, reason: str, beam: int | None = None, batch: int | None = None) -> Skip:
    return Skip(task.bundle, task.runtime, task.precision, reason, beam, batch)


@dataclass(frozen=True)
class _TimedInputs:
    """The inputs a group times on, and the seconds preprocessing them took (None for synthetic inputs)."""

    pool: list[dict[str, Any]]
    preprocess_s: float | None


def _measure_combo(
    task: GroupTask,
    subject: Any,
    monitor: Any,
    inputs: _TimedInputs,
    decode_cfg: Any,
    beam: int,
    batch: int,
    quality: Quality | None,
) -> ComboResult:
    cfg = task.cfg
    batches = _make_batches(inputs.pool, batch)
    timed = timed_decoder(subject.step_model, sync=subject.sync)
    query = _timed_query(subject, timed, batches, decode_cfg)
    window = monitor.begin()
    timed_from = [time.perf_counter()]  # power averages the timed calls only: moved past the last warm-up call

    def mark(i: int, warmup: bool) -> None:
        if warmup and i == cfg.warmup - 1:
            timed_from[0] = time.perf_counter()

    timings = run_loop(query, cfg.loop(), sync=subject.sync, on_call=mark)
    memory, power = monitor.end(window, power_from=timed_from[0])
    latency = LatencyStats.from_seconds(timings.times_s)
    queries: list[_Query] = timings.values
    timed_s = sum(timings.times_s)
    images = sum(q.images for q in queries)
    if power is not None and power.total_mean_mw is not None and images:
        power = dataclasses.replace(power, energy_per_image_mj=power.total_mean_mw * timed_s / images)
    return ComboResult(
        bundle=task.bundle,
        model=task.model,
        runtime=task.runtime,
        precision=task.precision,
        beam=beam,
        batch=batch,
        scenario="single-stream" if batch == 1 else "offline",
        device=subject.device,
        providers=list(subject.info["providers"]) if subject.info.get("providers") else None,
        threads=dict(subject.info["threads"]) if subject.info.get("threads") else None,
        provider_fallback=dict(subject.info["provider_fallback"]) if subject.info.get("provider_fallback") else None,
        input=subject.input_kind,
        backbone=subject.backbone_where,
        latency=latency,
        per_image_p50_ms=latency.p50_ms / batch,
        throughput=Throughput(
            images_per_s=images / timed_s if timed_s > 0 else 0.0,
            captions_per_s=sum(q.captions for q in queries) / timed_s if timed_s > 0 else 0.0,
            tokens_per_s=sum(q.tokens for q in queries) / timed_s if timed_s > 0 else 0.0,
        ),
        breakdown=_breakdown(timings.times_s, queries, inputs.preprocess_s),
        memory=memory,
        power=power,
        size=SizeInfo(subject.size_bytes, list(subject.files), subject.parameters, subject.backbone_parameters),
        quality=quality,
        speedup_vs_rerun=None,
        speedup_reference=None,
        loop=LoopInfo(cfg.warmup, len(timings.times_s), timed_s, [1e3 * t for t in timings.warmup_s]),
        load_s=subject.load_s,
        timings_ms=[1e3 * t for t in timings.times_s],
        length_level=decode_cfg.length_level,
    )


# -- running groups in fresh processes -------------------------------------------------------------------------------
_EVENT = "@@edgecap-bench@@ "


def _worker_main(argv: Sequence[str]) -> int:
    """Entry point of a worker process (``python -m edgecap.bench.run TASK.pkl OUTCOME.pkl``): reads the task, writes
    progress events as tagged lines on stdout and the outcome (or the error) to ``OUTCOME.pkl``."""
    import pickle

    task_path, outcome_path = argv

    def emit(event: str, label: str) -> None:
        print(f"{_EVENT}{event} {label}", flush=True)

    with open(task_path, "rb") as f:
        task = pickle.load(f)
    try:
        result: Any = measure_group(task, emit)
    except BaseException as exc:  # everything goes back to the parent, nothing is lost
        result = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
    with open(outcome_path, "wb") as f:
        pickle.dump(result, f)
    sys.stdout.flush()
    return 0


def _run_isolated(task: GroupTask, emit: Emit) -> GroupOutcome:
    """Run :func:`measure_group` in a fresh Python process.

    A plain subprocess (``python -m edgecap.bench.run``) rather than ``multiprocessing``: the caller's ``__main__``
    is never re-imported, so a script calling :func:`run_benchmark` needs no ``if __name__ == "__main__"`` guard.
    Other output of the worker goes to this process's stderr.
    """
    import pickle
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="edgecap-bench-") as tmp:
        task_path, outcome_path = Path(tmp, "task.pkl"), Path(tmp, "outcome.pkl")
        with open(task_path, "wb") as f:
            pickle.dump(task, f)
        # The worker imports the same edgecap as this process, installed or not (a source checkout on sys.path).
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        process = subprocess.Popen(
            [sys.executable, "-m", "edgecap.bench.run", str(task_path), str(outcome_path)],
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=env,
        )
        try:
            assert process.stdout is not None
            for line in process.stdout:
                if line.startswith(_EVENT):
                    event, _, label = line[len(_EVENT) :].rstrip("\n").partition(" ")
                    emit(event, label)
                else:
                    sys.stderr.write(line)
            code = process.wait()
        finally:
            if process.poll() is None:  # interrupted: stop the worker this call started
                terminate(process, timeout=10)
        if not outcome_path.is_file():
            hint = " (killed: out of memory?)" if code in (-9, 137) else ""
            return GroupOutcome(errors=[_error(task, f"worker process exited with code {code}{hint}")])
        with open(outcome_path, "rb") as f:
            result = pickle.load(f)
    if isinstance(result, str):
        return GroupOutcome(errors=[_error(task, result.strip())])
    return result


# -- linking results -------------------------------------------------------------------------------------------------
def link_results(results: Sequence[ComboResult]) -> list[ComboResult]:
    """Fill ``speedup_vs_rerun`` and the FP32 quality deltas.

    - speed-up: ``p50(torch-rerun) / p50(this)`` for the same bundle, beam and batch, against the re-run result of
      the same precision, else of FP32 (INT8 has no torch re-run); the baseline's own rows get 1.0.
    - quality: delta and ratio to the FP32 result of the same bundle and beam, on the same runtime when it was
      measured, else on the first other runtime measured at FP32 (torch before onnxruntime).
    """
    from edgecap.runtimes.registry import get_runtime, list_runtimes

    rerun = {(r.bundle, r.precision, r.beam, r.batch, r.length_level): r for r in results if r.runtime == RERUN}
    torch_runtimes = [name for name in list_runtimes() if get_runtime(name).torch]
    fp32_quality: dict[tuple[str, int, int | None], dict[str, Quality]] = {}
    for r in results:
        if r.precision == "fp32" and r.quality is not None:
            fp32_quality.setdefault((r.bundle, r.beam, r.length_level), {}).setdefault(r.runtime, r.quality)
    linked = []
    for r in results:
        changes: dict[str, Any] = {}
        key = (r.beam, r.batch, r.length_level)
        base = rerun.get((r.bundle, r.precision, *key)) or rerun.get((r.bundle, "fp32", *key))
        if base is not None and r.latency.p50_ms > 0:
            changes["speedup_vs_rerun"] = base.latency.p50_ms / r.latency.p50_ms
            changes["speedup_reference"] = f"{RERUN} {base.precision}"
        if r.quality is not None:
            refs = fp32_quality.get((r.bundle, r.beam, r.length_level), {})
            order = [r.runtime, *torch_runtimes, *sorted(refs)]
            runtime = next((name for name in order if name in refs), None)
            if runtime is not None:
                ref = refs[runtime]
                changes["quality"] = dataclasses.replace(
                    r.quality,
                    delta_to_fp32=r.quality.score - ref.score,
                    ratio_to_fp32=r.quality.score / ref.score if ref.score > 0 else None,
                    reference=f"{runtime} fp32",
                )
        linked.append(dataclasses.replace(r, **changes) if changes else r)
    return linked


# -- the entry point -------------------------------------------------------------------------------------------------
def _bundle_info(bundle: Any, quality_set: str | None, quality_note: str | None) -> BundleInfo:
    from edgecap.bench.subjects import bundle_input_kind, bundle_run_id

    spec = bundle.backbone_spec
    return BundleInfo(
        path=str(bundle.path),
        name=bundle.name,
        family=bundle.manifest.get("model", {}).get("family"),
        parameters=bundle.manifest.get("model", {}).get("parameters"),
        precisions=list(bundle.precisions),
        input=bundle_input_kind(bundle),
        backbone=(
            f"{spec.get('name')} {'in the encoder graph' if bundle.backbone_in_graph else 'in torch'}" if spec else None
        ),
        variants=bundle.summary(),
        quality_set=quality_set,
        quality_note=quality_note,
        run=bundle_run_id(bundle),
    )


def _notes(cfg: BenchCfg, results: Sequence[ComboResult], bundles: Sequence[BundleInfo] = ()) -> list[str]:
    notes = [
        "Percentiles interpolate linearly between order statistics (numpy's default, as optimum-benchmark); the "
        "p50 95 % CI is distribution-free (order statistics).",
        "A query decodes a whole caption: its number of decode steps depends on the input, so part of the spread "
        "is the inputs' caption lengths, not noise (see 'steps').",
        "Throughput = images in the timed queries / their total time; captions/s counts returned captions (one per "
        "image); tokens/s counts generated tokens of the best hypothesis (EOS included).",
        (
            "Each bundle × runtime × precision ran in a fresh Python process: memory numbers do not "
            "include earlier models."
            if cfg.isolate
            else "All combinations ran in one process: RSS baselines include models loaded earlier in the run."
        ),
    ]
    if cfg.images is None:
        notes.append(
            "Inputs are synthetic (random pixels or region features): caption lengths, and so decode time, can "
            "differ from real images; pass --images DIR for a representative pool."
        )
    heavy = sorted(
        {f"{r.runtime} {r.precision}" for r in results if r.breakdown.search_overhead_ms > 0.5 * r.latency.mean_ms}
    )
    if heavy:
        notes.append(
            f"Search overhead is more than half of the query time for {', '.join(heavy)}: time outside the "
            "encoder/step/select calls (the search's torch ops, processors, detokenisation). On few cores this is "
            "often two thread pools spinning against each other (e.g. ONNX Runtime's and torch's OpenMP threads); "
            "try --threads 1 or OMP_WAIT_POLICY=PASSIVE."
        )
    if any(r.length_level is not None for r in results):
        notes.append(
            "Length-controllable bundles were measured per length level. Mask-predict bundles (LaBERT) run a fixed "
            "number of refinement passes per level, each over the whole caption: 'steps' counts passes and "
            "'decoder' their time; beam search does not apply (beam 1)."
        )
    torch_runs = {b.run for b in bundles if (b.backbone or "").endswith(" in torch")}
    alone = [
        b.path for b in bundles if (b.backbone or "").endswith(" in the encoder graph") and b.run not in torch_runs
    ]
    if alone:
        notes.append(
            f"{', '.join(alone)}: pixels-in, benchmarked without a torch-backbone bundle of the same run, so the "
            "'pixels-in vs torch backbone' ratio is missing; export the same run with its backbone in torch and pass "
            "both bundles (docs/benchmarks.md, 'Pixels-in vs the torch backbone')."
        )
    if any(r.runtime == "onnxruntime" and r.precision == "fp16" and r.device == "cpu" for r in results):
        notes.append(
            "FP16 graphs on ONNX Runtime's CPU provider run with inserted casts and are expected to be slower than "
            "FP32; FP16 is meant for GPUs/NPUs."
        )
    return notes


def run_benchmark(cfg: BenchCfg, progress: bool = True, *, command: str | None = None) -> BenchReport:
    """Measure every combination of ``cfg`` and return the report (write it with
    :func:`~edgecap.bench.report.write_report`).

    Raises:
        BenchCfgError: bad configuration.
        edgecap.length.LengthLevelError: length levels asked of a bundle without length control.
        edgecap.bundle.BundleError: a bundle is missing, corrupt or inconsistent (checked before any timing).
        FileNotFoundError, ValueError: ``images``/``quality_data`` given but unusable.
    """
    from edgecap.bench.environment import capture_environment
    from edgecap.bench.subjects import bundle_input_kind, list_images, resolve_quality_set, skip_reason
    from edgecap.bundle import load_bundle

    environment = capture_environment()
    if cfg.threads is not None:
        environment["threads_requested"] = cfg.threads
    image_paths = tuple(str(p) for p in list_images(cfg.images, cfg.max_images)) if cfg.images else None
    bundles, tasks, skipped = [], [], []
    for path in cfg.bundles:
        bundle = load_bundle(path, verify=True, graphs="none")
        levels, beyond = cfg.levels_for(bundle)  # first: a level the bundle cannot take is refused before any work
        quality_set, quality_text = None, None
        if cfg.quality and cfg.quality_images > 0:
            quality_set, quality_text = resolve_quality_set(
                bundle, cfg.quality_data, cfg.quality_features, cfg.quality_images
            )
        else:
            quality_text = "quality measurement switched off"
        bundles.append(
            _bundle_info(bundle, quality_text if quality_set else None, None if quality_set else quality_text)
        )
        beams = (1,) if bundle.decoding == "mask_predict" else (cfg.beams or (bundle.beam,))
        precisions = cfg.precisions or bundle.precisions
        if image_paths is not None and bundle_input_kind(bundle) == "features":
            for runtime in cfg.runtimes:
                for precision in precisions:
                    skipped.append(
                        Skip(str(bundle.path), runtime, precision, "--images: this bundle captions region features")
                    )
            continue
        for runtime in cfg.runtimes:
            for precision in precisions:
                reason = skip_reason(runtime, precision, bundle, cfg.device)
                if reason is None and not levels:
                    reason = "; ".join(beyond)
                if reason is not None:
                    skipped.append(Skip(str(bundle.path), runtime, precision, reason))
                    continue
                skipped.extend(Skip(str(bundle.path), runtime, precision, why) for why in beyond)
                tasks.append(
                    GroupTask(
                        str(bundle.path), bundle.name, runtime, precision, beams, cfg, image_paths, quality_set, levels
                    )
                )

    results: list[ComboResult] = []
    errors: list[Skip] = []
    units = sum(len(t.beams) * len(t.levels) * (len(cfg.batches) + (t.quality_set is not None)) for t in tasks)
    with _Progress(units, enabled=progress) as bar:
        for task in tasks:
            outcome = _run_isolated(task, bar) if cfg.isolate else _run_in_process(task, bar)
            results.extend(outcome.results)
            errors.extend(outcome.errors)
    results = link_results(results)
    return BenchReport(
        schema_version=SCHEMA_VERSION,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        config=cfg.to_dict(),
        environment=environment,
        bundles=bundles,
        results=results,
        skipped=skipped,
        errors=errors,
        notes=_notes(cfg, results, bundles),
        command=command,
    )


def _run_in_process(task: GroupTask, emit: Emit) -> GroupOutcome:
    try:
        return measure_group(task, emit)
    except Exception as exc:  # a group that cannot load is an error entry, the run goes on
        return GroupOutcome(errors=[_error(task, f"{type(exc).__name__}: {exc}")])


class _Progress:
    """Progress over units of work (quality runs and timing runs): a rich bar when rich is installed (``[train]``),
    else one line per finished unit on stderr (a runtime-only install), or nothing."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self._progress: Any = None
        self._task: Any = None
        self._plain = False
        self._done = 0

    def __enter__(self) -> _Progress:
        if not (self.enabled and self.total):
            return self
        try:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        except ImportError:
            self._plain = True
            return self
        self._progress = Progress(
            TextColumn("[bold]bench[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task("starting", total=self.total)
        return self

    def __call__(self, event: str, label: str) -> None:
        if self._plain and event == "done":
            self._done += 1
            print(f"bench [{self._done}/{self.total}] {label}", file=sys.stderr, flush=True)
        if self._progress is None:
            return
        if event == "start":
            self._progress.update(self._task, description=label)
        elif event == "done":
            self._progress.advance(self._task)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


if __name__ == "__main__":  # a benchmark worker; the real module holds the classes the outcome is pickled with
    import sys

    from edgecap.bench.run import _worker_main as _main

    sys.exit(_main(sys.argv[1:]))
