"""The report's headline ratios: what each deployment choice buys or costs, computed from measured results.

Which span a target is judged on, and what the target is, belong to the caller (:mod:`edgecap.bench.series`);
this module only computes and tabulates.

Three comparisons between results of the same bundle, beam and batch (so the same images and caption lengths):

- **cached vs re-run prefix** (``torch`` / ``torch-rerun``, FP32): what the decoder cache buys, the way the reference
  implementations decode.
- **ONNX Runtime vs torch eager** (``onnxruntime`` FP32 / ``torch`` FP32): what the export buys.
- **INT8 vs FP32** (both ``onnxruntime``): encoder speed-up, size on disk, CIDEr-D delta.

and one between two bundles of the same run (:attr:`~edgecap.bench.results.BundleInfo.run`) benchmarked in one report:

- **pixels-in vs torch backbone** (same runtime, precision, beam, batch): the bundle whose encoder graph holds the
  backbone against the bundle whose backbone runs in torch eager (rebuilt from its spec) before the same precision's
  graphs. Both start at the same preprocessed pixels, so the end-to-end ratio is the deployment question "what does
  putting the backbone in the graph buy". Its encoder and decode spans count the torch backbone on the baseline side,
  since the subject's encoder graph contains it.

Speed is compared on three spans, because they answer different questions and dilute differently:

- *decoder loop*: every ``step`` + ``select`` + the search's own work (what a cached decoder changes);
- *decode*: the encoder plus the decoder loop (caption from features; the backbone excluded, since a bundle exported
  without its backbone runs it in torch for every runtime);
- *end to end*: the query's p50 latency, backbone and detokenisation included.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import cast

from edgecap.bench.results import Breakdown, BundleInfo, ComboResult

__all__ = [
    "BACKBONE_COMPARISON",
    "HeadlineRatio",
    "SPANS",
    "RatioSeries",
    "backbone_pairs",
    "decode_ms",
    "headline_ratios",
    "loop_ms",
    "ratio_lines",
    "ratio_series",
    "series_lines",
]


def loop_ms(b: Breakdown) -> float:
    """The decoder loop of one query: steps, beam reordering and the search's own work."""
    return b.decoder_ms + b.select_ms + b.search_overhead_ms


def decode_ms(b: Breakdown) -> float:
    """Encoder + decoder loop (the backbone excluded)."""
    return b.encoder_ms + loop_ms(b)


@dataclass(frozen=True)
class _Comparison:
    """Which comparison, where.

    Attributes:
        comparison: ``"cached vs re-run prefix"``, ``"onnxruntime vs torch"`` or ``"int8 vs fp32"``.
        model, beam, batch: where (``model`` carries `` L<level>`` for a per-level result).
        subject, baseline: ``"runtime precision"`` labels.
    """

    comparison: str
    model: str
    beam: int
    batch: int
    subject: str
    baseline: str


@dataclass(frozen=True)
class HeadlineRatio(_Comparison):
    """One comparison of two results (``subject`` against ``baseline``) at one bundle/beam/batch.

    Attributes:
        loop_speedup, decode_speedup, end_to_end_speedup: baseline time / subject time on each span.
        step_speedup: per-``step`` time ratio.
        encoder_speedup: encoder time ratio.
        size_ratio: subject size / baseline size on disk.
        quality_delta: subject CIDEr-D − baseline CIDEr-D (×100), when both were measured.
    """

    loop_speedup: float | None
    decode_speedup: float | None
    end_to_end_speedup: float | None
    step_speedup: float | None
    encoder_speedup: float | None
    size_ratio: float | None
    quality_delta: float | None


#: The comparison of a pixels-in bundle with the same run's torch-backbone bundle: what putting the backbone in the
#: graph buys end to end (the span a target on it is judged on, :func:`edgecap.bench.series.judged_span`).
BACKBONE_COMPARISON = "pixels-in vs torch backbone"

_COMPARISONS: tuple[tuple[str, tuple[str, str], tuple[str, str]], ...] = (
    ("cached vs re-run prefix", ("torch", "fp32"), ("torch-rerun", "fp32")),
    ("onnxruntime vs torch", ("onnxruntime", "fp32"), ("torch", "fp32")),
    ("int8 vs fp32", ("onnxruntime", "int8"), ("onnxruntime", "fp32")),
)


def _div(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _compare(
    name: str,
    subject: ComboResult,
    baseline: ComboResult,
    labels: tuple[str, str] = ("", ""),
    model: str | None = None,
) -> HeadlineRatio:
    s, b = subject.breakdown, baseline.breakdown
    quality = None
    if subject.quality is not None and baseline.quality is not None:
        quality = (subject.quality.score - baseline.quality.score) * 100
    backbone = (b.backbone_ms or 0.0) if name == BACKBONE_COMPARISON else 0.0  # inside the subject's encoder graph
    return HeadlineRatio(
        comparison=name,
        model=(model or subject.model) + ("" if subject.length_level is None else f" L{subject.length_level}"),
        beam=subject.beam,
        batch=subject.batch,
        subject=f"{subject.runtime} {subject.precision}{labels[0]}",
        baseline=f"{baseline.runtime} {baseline.precision}{labels[1]}",
        loop_speedup=_div(loop_ms(b), loop_ms(s)),
        decode_speedup=_div(backbone + decode_ms(b), decode_ms(s)),
        end_to_end_speedup=_div(baseline.latency.p50_ms, subject.latency.p50_ms),
        step_speedup=_div(b.decoder_step_ms, s.decoder_step_ms),
        encoder_speedup=_div(backbone + b.encoder_ms, s.encoder_ms),
        size_ratio=_div(float(subject.size.bytes), float(baseline.size.bytes)),
        quality_delta=quality,
    )


def headline_ratios(results: Iterable[ComboResult], bundles: Iterable[BundleInfo] = ()) -> list[HeadlineRatio]:
    """Every comparison whose two results exist, grouped by bundle, beam, batch and length level (in that order),
    then, given the report's ``bundles``, each pixels-in result against the same run's torch-backbone result."""
    results = list(results)
    names = _model_labels(results)
    by_key: dict[tuple[str, int, int, int], dict[tuple[str, str], ComboResult]] = {}
    for r in results:
        by_key.setdefault((r.bundle, r.beam, r.batch, r.length_level or 0), {})[(r.runtime, r.precision)] = r
    ratios = []
    for key in sorted(by_key):
        found = by_key[key]
        for name, subject, baseline in _COMPARISONS:
            if subject in found and baseline in found:
                ratios.append(_compare(name, found[subject], found[baseline], model=names[key[0]]))
    labels = (" pixels-in", " + torch backbone")
    pairs = backbone_pairs(results, bundles)
    ratios.extend(_compare(BACKBONE_COMPARISON, s, b, labels, model=s.model) for s, b in pairs)
    return ratios


def _model_labels(results: Sequence[ComboResult]) -> dict[str, str]:
    """bundle -> its label in the table: the model name, plus the bundle's directory name when two bundles of one
    report share a model name (a pixels-in bundle and its torch-backbone twin)."""
    bundles: dict[str, set[str]] = {}
    for r in results:
        bundles.setdefault(r.model, set()).add(r.bundle)
    return {
        r.bundle: r.model if len(bundles[r.model]) == 1 else f"{r.model} ({PurePath(r.bundle).name})" for r in results
    }


def backbone_pairs(
    results: Iterable[ComboResult], bundles: Iterable[BundleInfo]
) -> list[tuple[ComboResult, ComboResult]]:
    """(pixels-in result, torch-backbone result) pairs: bundles of the same run (``BundleInfo.run``), one with the
    backbone in its encoder graph and one running it in torch, at the same runtime, precision, beam, batch and level.
    """
    run_of = {b.path: b.run for b in bundles if b.run}
    sides: dict[str, dict[tuple[str, str, str, int, int, int], ComboResult]] = {"graph": {}, "torch": {}}
    for r in results:
        run = run_of.get(r.bundle)
        if run is not None and r.backbone in sides:
            key = (run, r.runtime, r.precision, r.beam, r.batch, r.length_level or 0)
            sides[r.backbone].setdefault(key, r)
    graph, torch_side = sides["graph"], sides["torch"]
    order = sorted(k for k in graph if k in torch_side)
    return [(graph[k], torch_side[k]) for k in order]


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.0f} %"


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f}"


_COLUMNS: Sequence[tuple[str, Callable[[HeadlineRatio], str]]] = (
    ("comparison", lambda h: h.comparison),
    ("model", lambda h: h.model),
    ("beam", lambda h: str(h.beam)),
    ("batch", lambda h: str(h.batch)),
    ("subject / baseline", lambda h: f"{h.subject} / {h.baseline}"),
    ("decoder loop", lambda h: _x(h.loop_speedup)),
    ("per step", lambda h: _x(h.step_speedup)),
    ("decode (encoder + loop)", lambda h: _x(h.decode_speedup)),
    ("end to end p50", lambda h: _x(h.end_to_end_speedup)),
    ("encoder", lambda h: _x(h.encoder_speedup)),
    ("size", lambda h: _pct(h.size_ratio)),
    ("Δ CIDEr-D", lambda h: _signed(h.quality_delta)),
)


def ratio_lines(results: Iterable[ComboResult], bundles: Iterable[BundleInfo] = ()) -> list[str]:
    """The markdown section (empty when no comparison has both of its results)."""
    ratios = headline_ratios(results, bundles)
    if not ratios:
        return []
    lines = [
        "## Headline ratios (speed-ups: baseline time / subject time)",
        "",
        "Decoder loop = steps + beam reordering + search; decode = encoder + decoder loop (backbone excluded); "
        "end to end = p50 query latency. Size = subject / baseline on disk.",
    ]
    if any(h.comparison == BACKBONE_COMPARISON for h in ratios):
        lines.append(
            f"'{BACKBONE_COMPARISON}' pairs two bundles of the same run on the same inputs: the encoder graph holding "
            "the backbone against the backbone in torch eager before the same precision's graphs; its encoder and "
            "decode spans include the torch backbone on the baseline side."
        )
    lines += ["", *_table([c[0] for c in _COLUMNS], ([f(h) for _, f in _COLUMNS] for h in ratios))]
    return [*lines, ""]


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Markdown table lines; the five label columns (comparison … subject / baseline) left-aligned, numbers right."""
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i < 5 else "---:" for i in range(len(header))) + "|",
    ]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


# -- a series of reports ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RatioSeries(_Comparison):
    """One comparison's speed-ups over several reports of the same bundles: the spread a single report hides.

    On a shared or thermally throttled machine one report's ratio moves from run to run (a neighbour's load slows one
    runtime more than the other), so a caller judges a target on the series: the median, the worst run, and how many
    runs fall below it on the span it chooses.

    Attributes:
        loop, step, decode, end_to_end: the per-report speed-ups on each span, in report order.
    """

    loop: tuple[float, ...]
    step: tuple[float, ...]
    decode: tuple[float, ...]
    end_to_end: tuple[float, ...] = ()

    @property
    def runs(self) -> int:
        return max(len(self.loop), len(self.end_to_end))

    def values(self, span: str) -> tuple[float, ...]:
        """The per-report speed-ups on ``span``: one of :data:`SPANS`."""
        if span not in SPANS:
            raise ValueError(f"unknown span {span!r}; choose one of {SPANS}")
        return getattr(self, span)

    def below(self, target: float, span: str = "loop") -> int:
        """Reports whose speed-up on ``span`` is under ``target``."""
        return sum(value < target for value in self.values(span))


#: The spans a :class:`RatioSeries` holds.
SPANS = ("loop", "step", "decode", "end_to_end")


def ratio_series(
    reports: Iterable[Iterable[ComboResult] | tuple[Iterable[ComboResult], Iterable[BundleInfo]]],
) -> list[RatioSeries]:
    """Group the headline ratios of several reports by comparison, model, beam, batch and subject/baseline (in first
    appearance order); a span a report could not compute (None) is left out of that span's series.

    Args:
        reports: each report's results, or ``(results, bundles)`` so that bundles of one run are paired
            (``pixels-in vs torch backbone``).
    """
    grouped: dict[tuple[str, str, int, int, str, str], list[HeadlineRatio]] = {}
    for report in reports:
        pair = isinstance(report, tuple) and len(report) == 2 and not isinstance(report[0], ComboResult)
        results, bundles = cast("tuple[Iterable[ComboResult], Iterable[BundleInfo]]", report if pair else (report, ()))
        for h in headline_ratios(results, bundles):
            grouped.setdefault((h.comparison, h.model, h.beam, h.batch, h.subject, h.baseline), []).append(h)

    def values(ratios: list[HeadlineRatio], span: str) -> tuple[float, ...]:
        return tuple(v for v in (getattr(h, span) for h in ratios) if v is not None)

    return [
        RatioSeries(
            *key,
            loop=values(ratios, "loop_speedup"),
            step=values(ratios, "step_speedup"),
            decode=values(ratios, "decode_speedup"),
            end_to_end=values(ratios, "end_to_end_speedup"),
        )
        for key, ratios in grouped.items()
    ]


def _spread(values: tuple[float, ...]) -> str:
    if not values:
        return "–"
    return f"{statistics.median(values):.2f}× ({min(values):.2f}–{max(values):.2f})"


def series_lines(
    series: Iterable[RatioSeries],
    target: float | None = None,
    span: str | Callable[[RatioSeries], str] = "loop",
) -> list[str]:
    """A markdown table: median (min–max) per span, and with ``target`` the runs whose ``span`` falls below it
    (``span``: one of :data:`SPANS`, or a function choosing it per series)."""
    header = ["comparison", "model", "beam", "batch", "subject / baseline", "runs", "decoder loop", "per step"]
    header += ["decode", "end to end"] + ([] if target is None else [f"judged < {target:g}×"])
    rows = []
    for s in series:
        cells = [s.comparison, s.model, str(s.beam), str(s.batch), f"{s.subject} / {s.baseline}", str(s.runs)]
        cells += [_spread(s.loop), _spread(s.step), _spread(s.decode), _spread(s.end_to_end)]
        if target is not None:
            judged = span(s) if callable(span) else span
            cells.append(f"{s.below(target, judged)} of {s.runs} ({judged.replace('_', ' ')})")
        rows.append(cells)
    return _table(header, rows)
