"""What a benchmark measured, as frozen dataclasses: one :class:`ComboResult` per combination inside a
:class:`BenchReport` (the layout of ``report.json``: ``report.schema.json``, ``docs/formats/report.md``).

The one module the measuring (:mod:`edgecap.bench.measure`), the reading and writing (:mod:`edgecap.bench.report`)
and the formatting (:mod:`edgecap.bench.markdown`, :mod:`edgecap.bench.plots`, :mod:`edgecap.bench.ratios`) share,
so none of those imports another for the types.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgecap.bench.harness import LatencyStats
from edgecap.bench.memory import MemoryStats, PowerStats
from edgecap.bench.typed_json import ReportError, build, current_runtime_names, jsonable
from edgecap.runtime.schema import check, load_schema

__all__ = [
    "SCHEMA_PATH",
    "SCHEMA_VERSION",
    "BenchReport",
    "Breakdown",
    "BundleInfo",
    "ComboResult",
    "LoopInfo",
    "Quality",
    "ReportError",
    "SizeInfo",
    "Skip",
    "Throughput",
]

#: Version of the ``report.json`` layout; readers refuse newer ones. Bump on any incompatible change.
SCHEMA_VERSION = 1
#: The schema of ``report.json`` (package data): what :meth:`BenchReport.from_dict` checks and
#: ``docs/formats/report.md`` is generated from (``python -m edgecap.runtime.schema_docs``).
SCHEMA_PATH = Path(__file__).with_name("report.schema.json")


@dataclass(frozen=True)
class Throughput:
    """Offline throughput: work per second over the timed calls (volume / mean latency, as optimum-benchmark).

    Attributes:
        images_per_s: images captioned per second.
        captions_per_s: caption strings returned per second (images × captions per image; 1 with ``n_best=1``).
        tokens_per_s: generated tokens per second (best hypothesis per image, EOS included when emitted).
    """

    images_per_s: float
    captions_per_s: float
    tokens_per_s: float


@dataclass(frozen=True)
class Breakdown:
    """Where one query's time goes (means over the timed queries, milliseconds per query unless noted).

    Attributes:
        backbone_ms: the torch backbone before the encoder (None when it is in the encoder graph or absent).
        encoder_ms: ``StepModel.encode`` (the encoder graph, with the backbone when it is inside it).
        decoder_ms: all ``StepModel.step`` calls.
        decoder_step_ms: mean time of one ``step`` call (all hypotheses advance one token): the per-token cost.
        select_ms: ``StepModel.select`` calls (beam expansion, reordering).
        search_overhead_ms: the rest: search bookkeeping, processors, detokenisation, proxy timing.
        ttft_ms: time to first token: backbone + encoder + first step.
        steps: decode iterations actually taken per query.
        hypothesis_steps: hypotheses advanced per query (steps × live rows).
        tokens_per_caption: generated tokens of the best hypothesis, EOS included when emitted.
        words_per_caption: words of the returned caption.
        preprocess_ms_per_image: image decoding + resize + normalisation per image, outside the timed region
            (None for synthetic inputs or region features).
    """

    backbone_ms: float | None
    encoder_ms: float
    decoder_ms: float
    decoder_step_ms: float | None
    select_ms: float
    search_overhead_ms: float
    ttft_ms: float | None
    steps: float
    hypothesis_steps: float
    tokens_per_caption: float
    words_per_caption: float
    preprocess_ms_per_image: float | None = None


@dataclass(frozen=True)
class SizeInfo:
    """Size of what a runtime/precision loads.

    Attributes:
        bytes: on-disk bytes of ``files``.
        files: bundle files loaded (ONNX graphs, or ``weights.safetensors``; plus the backbone's weights file when
            the bundle carries one and it runs in torch).
        parameters: parameters of the captioner.
        backbone_parameters: parameters of a backbone run in torch (None when in the graph or absent).
    """

    bytes: int
    files: list[str]
    parameters: int | None
    backbone_parameters: int | None = None


@dataclass(frozen=True)
class Quality:
    """Caption quality of a bundle/runtime/precision/beam on the fixed quality set (a run separate from timing).

    Attributes:
        metric: ``"CIDEr-D"`` (``edgecap.workshop.evaluation.cider_d``, pycocoevalcap scale, document frequencies from
        the
            set's references).
        score: the metric.
        images: images scored.
        set: which images.
        beam: beam size used.
        delta_to_fp32: ``score − score(FP32)``, same bundle and beam (same runtime when it was measured).
        ratio_to_fp32: ``score / score(FP32)`` (MLPerf states quality targets as 99 % of FP32).
        reference: which FP32 result the delta refers to (``"onnxruntime fp32"``).
    """

    metric: str
    score: float
    images: int
    set: str
    beam: int
    delta_to_fp32: float | None = None
    ratio_to_fp32: float | None = None
    reference: str | None = None


@dataclass(frozen=True)
class LoopInfo:
    """The repeat loop of one combination.

    Attributes:
        warmup: untimed calls.
        repeats: timed calls.
        timed_s: their total seconds.
        warmup_ms: durations of the untimed calls (the first one is the cold call).
    """

    warmup: int
    repeats: int
    timed_s: float
    warmup_ms: list[float]


@dataclass(frozen=True)
class ComboResult:
    """One measured combination: bundle × runtime × precision × beam × batch (× length level).

    Attributes:
        bundle, model: bundle directory and model name.
        runtime, precision, beam, batch: the combination.
        scenario: ``"single-stream"`` (batch 1, one image per query, MLPerf SingleStream) or ``"offline"``.
        device: ``cpu``/``cuda…``; providers: ONNX Runtime providers in use (None for torch).
        input: where the timed region starts: ``"pixels"`` or ``"features"``.
        backbone: ``"torch"``, ``"graph"`` or None.
        latency: per-query latency (a query = one batch).
        per_image_p50_ms: ``latency.p50_ms / batch``.
        throughput, breakdown, memory, power, size, quality: see their classes.
        speedup_vs_rerun: p50 latency of ``torch-rerun`` / this p50, same bundle, beam and batch, same precision
            (FP32 when the precision has no re-run result, e.g. INT8); 1.0 on the baseline's own rows.
        speedup_reference: which re-run result it divides (``"torch-rerun fp32"``).
        loop: the repeat loop.
        load_s: seconds to load the bundle on this runtime (checksums off).
        timings_ms: every timed query latency, in order.
        length_level: the 1-based length level decoded at (LaBERT, ``*-len`` bundles; ``--length-level``), None for
            a bundle without length control. Reports written before the field read as None.
        threads: the ONNX Runtime threading the sessions ran with on CPU (``intra_op``, ``inter_op``, ``spin``,
            ``execution_mode``, ``policy``, ``reason``, ``wide``;
            :class:`edgecap.runtime.backends.threads.ThreadPlan`); None
            for other runtimes and in reports written before the field.
        provider_fallback: the execution providers that were requested but did not start, with ONNX Runtime's cause
            (``requested``, ``in_use``, ``cause``): the row was measured on what ran. None when nothing fell back and
            in reports written before the field.
    """

    bundle: str
    model: str
    runtime: str
    precision: str
    beam: int
    batch: int
    scenario: str
    device: str
    providers: list[str] | None
    input: str
    backbone: str | None
    latency: LatencyStats
    per_image_p50_ms: float
    throughput: Throughput
    breakdown: Breakdown
    memory: MemoryStats
    power: PowerStats | None
    size: SizeInfo
    quality: Quality | None
    speedup_vs_rerun: float | None
    speedup_reference: str | None
    loop: LoopInfo
    load_s: float
    timings_ms: list[float]
    length_level: int | None = None
    threads: dict[str, Any] | None = None
    provider_fallback: dict[str, Any] | None = None


@dataclass(frozen=True)
class BundleInfo:
    """A benchmarked bundle.

    Attributes:
        path, name, family: where and what.
        parameters: captioner parameters (manifest).
        precisions: variants it holds.
        input: ``"pixels"`` or ``"features"``.
        backbone: backbone name, or None for region-feature bundles.
        variants: the manifest's per-variant summary (size, export parity, export-time quality check).
        quality_set: the quality subset used, or None.
        quality_note: why quality was not measured, when it was not.
        run: the trained weights behind the bundle (captioner + backbone weights' SHA-256 prefixes): bundles exported
            from the same run share it, which pairs a pixels-in bundle with its torch-backbone twin. None in reports
            written before the field.
        recipe: the manifest's ``compression.recipe`` (``qat``, ``distillation+pruning``), None for a bundle without
            compression steps (and in reports written before the field).
        variant_recipes: precision -> how that variant was made (``qat + int8``, ``baseline + int8 accuracy-aware
            (2 layers float)``; :func:`edgecap.bench.compression.bundle_compression`). None in older reports.
        int8_selection: the INT8 variant's accuracy-aware selection record from the manifest (layers kept float, their
            measured effect, target, final quality), None without one.
    """

    path: str
    name: str
    family: str | None
    parameters: int | None
    precisions: list[str]
    input: str
    backbone: str | None
    variants: list[dict[str, Any]]
    quality_set: str | None = None
    quality_note: str | None = None
    run: str | None = None
    recipe: str | None = None
    variant_recipes: dict[str, str] | None = None
    int8_selection: dict[str, Any] | None = None


@dataclass(frozen=True)
class Skip:
    """A combination not measured (``skipped``: cannot exist here) or that failed (``errors``), with the reason."""

    bundle: str
    runtime: str
    precision: str
    reason: str
    beam: int | None = None
    batch: int | None = None


@dataclass(frozen=True)
class BenchReport:
    """A benchmark report (``report.json``; ``docs/formats/report.md``).

    Attributes:
        schema_version: :data:`SCHEMA_VERSION`.
        created: UTC time, ISO 8601.
        command: the command line, when run from the CLI.
        config: the ``BenchCfg`` it ran with.
        environment: hardware and software (``edgecap.bench.environment.capture_environment``).
        bundles: one entry per bundle.
        results: one entry per measured combination.
        skipped: combinations that cannot run here, with reasons.
        errors: combinations (or whole runtime/precision groups) that failed, with the error.
        notes: methodology notes worth reading next to the numbers.
    """

    schema_version: int
    created: str
    config: dict[str, Any]
    environment: dict[str, Any]
    bundles: list[BundleInfo]
    results: list[ComboResult]
    skipped: list[Skip] = field(default_factory=list)
    errors: list[Skip] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    command: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Strict-JSON dict (tuples as lists, NaN/inf as null)."""
        return jsonable(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Any, where: str = "report") -> BenchReport:
        """Read a report dict, checked against ``report.schema.json`` (errors name ``where`` and the JSON path).

        Raises:
            ReportError: not a report, a newer schema, or a bad field.
        """
        if not isinstance(data, dict):
            raise ReportError(f"{where}: $: expected a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise ReportError(f"{where}: $.schema_version: missing or not an integer")
        if version > SCHEMA_VERSION:
            raise ReportError(
                f"{where}: report schema_version {version} is newer than this edgecap reads ({SCHEMA_VERSION}); "
                "upgrade edgecap"
            )
        data = current_runtime_names(data)
        check(data, load_schema(str(SCHEMA_PATH)), where, ReportError)
        return build(cls, data)
