"""Measuring one group: a bundle on one runtime at one precision, every beam × length level × batch of it.

Load the bundle on the runtime (timed: ``load_s``), prepare the inputs (untimed), then per beam and length level a
quality run (untimed, separate from the timing as MLPerf requires) and per batch a timing run: warm-up, then the
duration-based loop of :func:`~edgecap.bench.harness.run_loop`, with the step model wrapped in
:class:`~edgecap.bench.harness.TimedStepModel` (:class:`~edgecap.bench.harness.TimedRefineModel` for mask-predict)
for the encoder/decoder split and the memory high-water marks reset before it. Where the group runs (its own process
or this one) is :mod:`edgecap.bench.worker`'s business.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgecap.bench.config import BenchCfg
from edgecap.bench.harness import LatencyStats, StepTimes, run_loop, timed_decoder
from edgecap.bench.results import (
    Breakdown,
    ComboResult,
    LoopInfo,
    Quality,
    SizeInfo,
    Skip,
    Throughput,
)

__all__ = ["Emit", "GroupOutcome", "GroupTask", "error_entry", "measure_group"]


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
    from edgecap.workshop.evaluation.cider import cider_d

    captioner = _captioner(subject.step_model, subject.vocab, decode_cfg)
    captions: list[str] = []
    with inference_mode():
        for start in range(0, len(items), batch):
            inputs = subject.to_inputs(collate(items[start : start + batch]))
            captions.extend(reply.text for reply in captioner.caption(inputs))
    predictions = dict(zip(quality_set.image_ids, captions, strict=True))
    references = {i: list(refs) for i, refs in zip(quality_set.image_ids, quality_set.references, strict=True)}
    return cider_d(predictions, references)


def _captioner(step_model: Any, vocab: Any, decode_cfg: Any) -> Any:
    """A ``Captioner`` on prepared inputs: the bench decodes through the call every front end uses, with the step
    model it times (or the subject's own) and the decoding config of the combination."""
    from edgecap.runtime.captioner import Captioner

    return Captioner(None, step_model, vocab, decode_cfg, no_images_reason="the bench prepares its inputs itself")


def _timed_query(subject: Any, timed: Any, batches: list[dict[str, Any]], decode_cfg: Any) -> Callable:
    from edgecap.bench.subjects import inference_mode

    captioner = _captioner(timed, subject.vocab, decode_cfg)
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
            captions = captioner.caption(inputs)
        return _Query(
            backbone_s=backbone_s,
            steps=timed.times(),
            images=len(captions),
            captions=len(captions),
            tokens=sum(len(c.tokens) + int(c.finished) for c in captions),  # the EOS is a generated token too
            words=sum(len(c.text.split()) for c in captions),
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
    from edgecap.runtime.bundle import load_bundle

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
                        outcome.errors.append(error_entry(task, reason, beam))
                    emit("done", f"{name}: quality")
                for batch in cfg.batches:
                    emit("start", f"{name} batch {batch}")
                    try:
                        outcome.results.append(
                            _measure_combo(task, subject, mon, inputs, decode_cfg, beam, batch, quality)
                        )
                    except Exception as exc:  # e.g. out of memory at a large batch: record, go on
                        reason = f"{type(exc).__name__}: {exc}" + (f" (length level {level})" if level else "")
                        outcome.errors.append(error_entry(task, reason, beam, batch))
                    emit("done", f"{name} batch {batch}")
    finally:
        subject.close()
    return outcome


def _level_label(level: int | None) -> str:
    return "" if level is None else f" level {level}"


def error_entry(task: GroupTask, reason: str, beam: int | None = None, batch: int | None = None) -> Skip:
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
