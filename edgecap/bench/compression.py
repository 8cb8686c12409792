"""The compression view of a report: one row per bundle × precision naming how the variant was made (its recipe),
its size, the bench's own single-stream latency and the held-out CIDEr-D its manifest records, with the Pareto
fronts of size vs CIDEr-D and latency vs CIDEr-D.

Why the manifest's CIDEr-D and not the bench's quality run: the export measured every variant on the same held-out
images against the FP32 model (``variants[p]["quality"]``), so the numbers of a QAT, a pruned and a distilled bundle
of one model line up without re-running a quality pass per bundle. ACORT (Tan et al., 2022) notes that pruning,
quantisation and distillation "can be applied on top" of a compact captioner; this table is where their effects
meet on one chart.

Reads only report data (:class:`~edgecap.bench.results.BenchReport`); the manifest facts were copied into
:class:`~edgecap.bench.results.BundleInfo` when the bench opened the bundles (:func:`bundle_compression`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecap.bench.results import BenchReport, BundleInfo, ComboResult
from edgecap.runtime.bundle.manifest import compression_recipe, int8_selection

__all__ = [
    "BASELINE",
    "CompressionRow",
    "bundle_compression",
    "bundle_labels",
    "compression_lines",
    "compression_rows",
    "pareto_front",
    "wants_compression_chart",
]

#: The recipe of a bundle whose manifest records no compression step (every bundle exported before compression).
BASELINE = "baseline"


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates (lower-or-equal cost *and* higher-or-equal quality, one of
    them strictly), sorted by cost. Equal points do not dominate each other: both stay on the front."""
    front = []
    for i, (cost, qual) in enumerate(points):
        dominated = any(
            (c2 <= cost and q2 >= qual) and (c2 < cost or q2 > qual) for j, (c2, q2) in enumerate(points) if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], -points[i][1]))


def _variant_recipe(recipe: str | None, precision: str, selection: Mapping[str, Any] | None) -> str:
    base = recipe or BASELINE
    if precision != "int8":
        return base if precision == "fp32" else f"{base} + {precision}"
    if selection is None:
        return f"{base} + int8"
    count = len(selection["kept_float"])
    return f"{base} + int8 accuracy-aware ({count} layer{'' if count == 1 else 's'} float)"


def bundle_compression(manifest: Mapping[str, Any], precisions: Sequence[str]) -> dict[str, Any]:
    """The :class:`BundleInfo` fields the compression view needs, read from a manifest: ``recipe`` (the manifest's
    ``compression.recipe``, None for an uncompressed bundle), ``variant_recipes`` (precision -> label, e.g.
    ``qat + int8``, ``baseline + int8 accuracy-aware (2 layers float)``) and ``int8_selection`` (the INT8 variant's
    accuracy-aware selection record, None without one). Old manifests, without either record, read as baseline."""
    recipe, selection = compression_recipe(manifest), int8_selection(manifest)
    return {
        "recipe": recipe,
        "variant_recipes": {p: _variant_recipe(recipe, p, selection) for p in precisions},
        "int8_selection": selection,
    }


@dataclass(frozen=True)
class CompressionRow:
    """One bundle × precision of the compression view.

    Attributes:
        bundle, name, precision: which variant.
        recipe: how it was made (``distillation+pruning + int8``; ``baseline`` when the manifest records nothing).
        size_mb: the variant's files in the bundle (its ONNX graphs), 10⁶ bytes, from the manifest.
        latency_ms: the bench's batch-1 per-image p50 of this variant, None when it was not measured at batch 1.
        runtime, beam: what ``latency_ms`` was measured with (None with it).
        cider_d: the manifest's held-out CIDEr-D of the variant on the usual ×100 scale (the manifest stores a
            fraction), None without a quality record.
        quality_set: which images ``cider_d`` was measured on.
        on_size_front, on_latency_front: on the Pareto front of size vs CIDEr-D / latency vs CIDEr-D.
    """

    bundle: str
    name: str
    precision: str
    recipe: str
    size_mb: float | None
    latency_ms: float | None
    runtime: str | None
    beam: int | None
    cider_d: float | None
    quality_set: str | None
    on_size_front: bool = False
    on_latency_front: bool = False


def _manifest_quality(bundle: BundleInfo, precision: str) -> tuple[float | None, str | None]:
    """The variant's recorded CIDEr-D; FP32 has no record of its own but every other variant's check names it as
    the reference, on the same images."""
    rows = [v for v in bundle.variants if isinstance(v, Mapping)]
    for v in rows:
        if v.get("precision") == precision and isinstance(v.get("cider_d"), (int, float)):
            return 100 * float(v["cider_d"]), v.get("quality_set")
    if precision == "fp32":
        for v in rows:
            if isinstance(v.get("cider_d_reference"), (int, float)):
                return 100 * float(v["cider_d_reference"]), v.get("quality_set")
    return None, None


def _latency(results: Sequence[ComboResult], order: Sequence[str]) -> ComboResult | None:
    """The batch-1 result to quote: the first runtime of the run's order, its smallest beam and length level."""
    single = [r for r in results if r.batch == 1]
    rank = {name: i for i, name in enumerate(order)}
    single.sort(key=lambda r: (rank.get(r.runtime, len(rank)), r.beam, r.length_level or 0))
    return single[0] if single else None


def compression_rows(report: BenchReport) -> list[CompressionRow]:
    """One row per bundle × precision the report's bundles hold, with both Pareto fronts marked (a front is taken
    over the rows that have both numbers)."""
    order = [str(x) for x in report.config.get("runtimes") or ()]
    rows = []
    for b in report.bundles:
        sizes = {v.get("precision"): v.get("bytes") for v in b.variants if isinstance(v, Mapping)}
        recipes = b.variant_recipes or bundle_compression({}, b.precisions)["variant_recipes"]
        for precision in b.precisions:
            measured = _latency([r for r in report.results if r.bundle == b.path and r.precision == precision], order)
            cider, quality_set = _manifest_quality(b, precision)
            size = sizes.get(precision)
            rows.append(
                CompressionRow(
                    bundle=b.path,
                    name=b.name,
                    precision=precision,
                    recipe=recipes.get(precision) or BASELINE,
                    size_mb=size / 1e6 if isinstance(size, (int, float)) and size > 0 else None,
                    latency_ms=measured.per_image_p50_ms if measured else None,
                    runtime=measured.runtime if measured else None,
                    beam=measured.beam if measured else None,
                    cider_d=cider,
                    quality_set=quality_set,
                )
            )
    size_front = _front(rows, "size_mb")
    latency_front = _front(rows, "latency_ms")
    return [_replace(r, on_size_front=i in size_front, on_latency_front=i in latency_front) for i, r in enumerate(rows)]


def _front(rows: Sequence[CompressionRow], cost: str) -> set[int]:
    index = [i for i, r in enumerate(rows) if getattr(r, cost) is not None and r.cider_d is not None]
    points = [(float(getattr(rows[i], cost)), float(rows[i].cider_d or 0.0)) for i in index]
    return {index[k] for k in pareto_front(points)}


def _replace(row: CompressionRow, **changes: Any) -> CompressionRow:
    from dataclasses import replace

    return replace(row, **changes)


def bundle_labels(paths: Sequence[str]) -> dict[str, str]:
    """A short name per bundle path: its directory name, or its last two path parts when two bundles share the
    directory name (``bundles/acort-xsmall`` and ``meas/acort-xsmall``)."""
    names = [Path(p).name for p in paths]
    return {p: Path(p).name if names.count(Path(p).name) == 1 else "/".join(Path(p).parts[-2:]) for p in paths}


def wants_compression_chart(rows: Sequence[CompressionRow]) -> bool:
    """The chart is drawn without being asked when more than one variant has a recorded CIDEr-D (one point has no
    trade-off to show)."""
    return sum(r.cider_d is not None and r.size_mb is not None for r in rows) > 1


def _fmt(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def compression_lines(report: BenchReport, fmt_ms: Callable[[float | None], str]) -> list[str]:
    """The ``report.md`` section: the table, and which images the CIDEr-D was measured on. Empty when no bundle
    records compression and fewer than two variants have a quality record (a plain single-bundle report).
    ``fmt_ms`` formats milliseconds as the rest of the report does (passed in: :mod:`edgecap.bench.markdown` imports
    this module)."""
    rows = compression_rows(report)
    if not rows or (not wants_compression_chart(rows) and not any(b.recipe for b in report.bundles)):
        return []
    label = bundle_labels([b.path for b in report.bundles])
    lines = [
        "## Compression variants (recipe, size, latency, CIDEr-D)",
        "",
        "Size: the variant's files in the bundle. Latency: this run's batch-1 p50 per image (runtime and beam named). "
        "CIDEr-D: the held-out check the export recorded in the manifest (FP32: the reference of that check). "
        "Front: on the Pareto front of size vs CIDEr-D (S) and latency vs CIDEr-D (L).",
        "",
        "| bundle | precision | recipe | size MB | latency ms | runtime, beam | CIDEr-D | front |",
        "|:--|:--|:--|--:|--:|:--|--:|:--|",
    ]
    for r in rows:
        front = "".join(mark for mark, on in (("S", r.on_size_front), ("L", r.on_latency_front)) if on) or "–"
        where = f"{r.runtime}, b{r.beam}" if r.runtime else "not timed at batch 1"
        lines.append(
            f"| {label.get(r.bundle, r.bundle)} | {r.precision} | {r.recipe} | {_fmt(r.size_mb, 2)} "
            f"| {fmt_ms(r.latency_ms)} | {where} | {_fmt(r.cider_d, 1)} | {front} |"
        )
    sets = sorted({f"{label.get(r.bundle, r.bundle)}: {r.quality_set}" for r in rows if r.quality_set})
    lines += ["", "CIDEr-D measured on: " + ("; ".join(sets) if sets else "no variant has a quality record"), ""]
    return lines
