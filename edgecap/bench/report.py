"""``BenchReport``: what a benchmark measured, as dataclasses; ``report.json`` (schema in
``docs/bench-report-schema.md``); :func:`write_report` adds ``report.md`` (:mod:`edgecap.bench.markdown`) and the
plots (:mod:`edgecap.bench.plots`). Formatting never measures, measuring never formats.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgecap._io import atomic_write_json, atomic_write_text
from edgecap.bench.harness import LatencyStats
from edgecap.bench.memory import MemoryStats, PowerStats

__all__ = [
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
    "load_report",
    "write_report",
]

#: Version of the ``report.json`` layout; readers refuse newer ones. Bump on any incompatible change.
SCHEMA_VERSION = 1
#: How to get what the optional parts of a report (plots) need on a runtime-only install.
TRAIN_INSTALL = "pip install 'edgecap[train]'"


class ReportError(ValueError):
    """A report file that cannot be read: not JSON, a newer schema, or a missing/mistyped field (named)."""


# -- the report ------------------------------------------------------------------------------------------------------
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
        metric: ``"CIDEr-D"`` (``edgecap.evaluation.cider_d``, pycocoevalcap scale, document frequencies from the
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
            ``execution_mode``, ``policy``, ``reason``, ``wide``; :class:`edgecap.runtimes.threads.ThreadPlan`); None
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
    """A benchmark report (``report.json``; ``docs/bench-report-schema.md``).

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
        return _jsonable(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Any, where: str = "report") -> BenchReport:
        """Read a report dict, checking every field's presence and type (errors name the field).

        Raises:
            ReportError: not a report, a newer schema, or a bad field.
        """
        if not isinstance(data, dict):
            raise ReportError(f"{where}: expected a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise ReportError(f"{where}: field 'schema_version' is missing or not an integer")
        if version > SCHEMA_VERSION:
            raise ReportError(
                f"{where}: report schema_version {version} is newer than this edgecap reads ({SCHEMA_VERSION}); "
                "upgrade edgecap"
            )
        return _build(cls, _current_runtime_names(data), where)


# -- JSON (de)serialisation ------------------------------------------------------------------------------------------
def _current_runtime_names(value: Any) -> Any:
    """``value`` with every ``runtime``/``runtimes`` entry under its current registry name, so a report written
    before a runtime was renamed (``ort`` -> ``onnxruntime``) compares with a new one."""
    from edgecap.runtimes.registry import canonical_runtime

    if isinstance(value, list):
        return [_current_runtime_names(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _current_runtime_names(v) for k, v in value.items()}
    if isinstance(out.get("runtime"), str):
        out["runtime"] = canonical_runtime(out["runtime"])
    if isinstance(out.get("runtimes"), list):
        out["runtimes"] = [canonical_runtime(r) if isinstance(r, str) else r for r in out["runtimes"]]
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, where: str) -> Any:
    """``value`` (from JSON) as type ``tp``: dataclasses, optionals, lists, tuples, dicts and scalars."""
    if tp is Any:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise ReportError(f"{where}: must not be null")
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(option, value, where)
            except ReportError as exc:
                errors.append(str(exc))
        raise ReportError(errors[0] if len(errors) == 1 else f"{where}: matches none of {args} ({errors})")
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ReportError(f"{where}: expected a list, got {type(value).__name__}")
        return [_convert(args[0] if args else Any, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ReportError(f"{where}: expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ReportError(f"{where}: expected {len(args)} values, got {len(value)}")
        return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ReportError(f"{where}: expected an object, got {type(value).__name__}")
        return {k: _convert(args[1] if args else Any, v, f"{where}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ReportError(f"{where}: expected a number, got {type(value).__name__}")
        return float(value)
    if tp in (int, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ReportError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__}")
        return value
    raise ReportError(f"{where}: unsupported field type {_type_name(tp)}")


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ReportError(f"{where}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ReportError(f"{where}: field {f.name!r} is missing")
            continue
        kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}.{f.name}")
    return cls(**kwargs)


def load_report(path: str | Path) -> BenchReport:
    """Read and validate a ``report.json`` (a report directory also works).

    Raises:
        FileNotFoundError: no such file.
        ReportError: not JSON, or not a valid report (the message names the file and the field).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise FileNotFoundError(f"benchmark report not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: not a JSON benchmark report: {exc}") from exc
    return BenchReport.from_dict(data, str(path))


# -- writing ---------------------------------------------------------------------------------------------------------
def write_report(
    report: BenchReport, out_dir: str | Path, *, plots: bool = True, log: Callable[[str], Any] | None = None
) -> dict[str, Path]:
    """Write ``report.json``, the PNG plots (``plots=True``) and ``report.md`` (embedding them) into ``out_dir``;
    every file atomically.

    Returns:
        name -> path of every file written (``json``, ``latency_vs_batch``, ``pareto``, ``markdown``).
    """
    from edgecap.bench.markdown import format_markdown

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from edgecap.bench.environment import module_installed

    if plots and not module_installed("matplotlib"):  # a runtime-only install: the tables still go out
        note = f"PNG plots not written: they need matplotlib, which is not installed ({TRAIN_INSTALL})."
        report = dataclasses.replace(report, notes=[*report.notes, note])
        plots = False
        if log is not None:
            log(note)
    written: dict[str, Path] = {}
    atomic_write_json(out_dir / "report.json", report.to_dict())
    written["json"] = out_dir / "report.json"
    images: dict[str, Path] = {}
    if plots:
        from edgecap.bench.plots import plot_latency_vs_batch, plot_pareto

        for name, fn in (("latency_vs_batch", plot_latency_vs_batch), ("pareto", plot_pareto)):
            path = fn(report, out_dir / f"{name}.png")
            if path is not None:
                images[name] = path
            elif log is not None:
                log(f"{name}.png not written: nothing to plot")
    written.update(images)
    atomic_write_text(out_dir / "report.md", format_markdown(report, images) + "\n")
    written["markdown"] = out_dir / "report.md"
    return written
