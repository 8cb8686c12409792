"""Two benchmark reports side by side: the same combinations matched, each metric with the ratio B / A.

Typical uses: a board against a workstation, a new edgecap version against the last release, ``--threads 1`` against
``--threads 4``. Combinations are matched by model, runtime, precision, beam and batch (plus the bundle directory's
name when one report holds two bundles of the same model); combinations present in only one report are listed.
Ratios are B / A for every metric: for latency, memory and size below 1 means B is better, for throughput and
quality above 1 means B is better.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgecap.bench.markdown import fmt_mib, fmt_ms
from edgecap.bench.results import BenchReport, ComboResult

__all__ = ["METRICS", "Comparison", "Metric", "compare_reports", "format_comparison", "ratio"]


@dataclass(frozen=True)
class Metric:
    """A compared number.

    Attributes:
        name: key in :class:`Row` values and ``compare.json``.
        label: column header in markdown, with its unit.
        read: the number of a result (None when not measured).
        lower_is_better: direction of "better" (the header shows ↓ or ↑).
        fmt: how to print a value.
    """

    name: str
    label: str
    read: Callable[[ComboResult], float | int | None]
    lower_is_better: bool
    fmt: Callable[[Any], str]


def _quality(r: ComboResult) -> float | None:
    return None if r.quality is None else r.quality.score * 100


METRICS: tuple[Metric, ...] = (
    Metric("p50_ms", "p50 ms", lambda r: r.latency.p50_ms, True, fmt_ms),
    Metric("p90_ms", "p90 ms", lambda r: r.latency.p90_ms, True, fmt_ms),
    Metric("p99_ms", "p99 ms", lambda r: r.latency.p99_ms, True, fmt_ms),
    Metric("images_per_s", "images/s", lambda r: r.throughput.images_per_s, False, lambda v: f"{v:.2f}"),
    Metric("peak_rss_bytes", "peak RSS MiB", lambda r: r.memory.rss_peak_bytes, True, fmt_mib),
    Metric("gpu_peak_bytes", "GPU peak MiB", lambda r: r.memory.gpu_allocated_peak_bytes, True, fmt_mib),
    Metric("cider_d", "CIDEr-D ×100", _quality, False, lambda v: f"{v:.1f}"),
    Metric("size_bytes", "size MiB", lambda r: r.size.bytes, True, fmt_mib),
)


def ratio(b: float | int | None, a: float | int | None) -> float | None:
    """``b / a``, None when either is missing or ``a`` is 0."""
    if a is None or b is None or a == 0:
        return None
    return float(b) / float(a)


@dataclass(frozen=True)
class Row:
    """One matched combination.

    Attributes:
        key: ``(model, runtime, precision, beam, batch)``; ``model`` carries `` L<level>`` for a per-level result.
        bundles: the bundle directory names of the A and B results.
        values: per metric ``(A, B, B / A)``.
    """

    key: tuple[Any, ...]
    bundles: tuple[str, str]
    values: dict[str, tuple[float | None, float | None, float | None]]


@dataclass(frozen=True)
class Comparison:
    """The comparison of report A with report B.

    Attributes:
        a, b: where the reports came from (paths or labels).
        rows: matched combinations.
        only_a, only_b: keys present in one report only.
        environment: fields of the environment block that differ, ``{field: (A, B)}``.
    """

    a: str
    b: str
    rows: list[Row]
    only_a: list[tuple[Any, ...]] = field(default_factory=list)
    only_b: list[tuple[Any, ...]] = field(default_factory=list)
    environment: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        key_names = ("model", "runtime", "precision", "beam", "batch")
        return {
            "a": self.a,
            "b": self.b,
            "rows": [
                {
                    **dict(zip(key_names, row.key, strict=True)),
                    "bundle_a": row.bundles[0],
                    "bundle_b": row.bundles[1],
                    **{name: {"a": va, "b": vb, "ratio_b_over_a": r} for name, (va, vb, r) in row.values.items()},
                }
                for row in self.rows
            ],
            "only_a": [list(k) for k in self.only_a],
            "only_b": [list(k) for k in self.only_b],
            "environment": {k: list(v) for k, v in self.environment.items()},
        }


def _key(r: ComboResult) -> tuple[Any, ...]:
    model = r.model if r.length_level is None else f"{r.model} L{r.length_level}"  # per-level rows stay apart
    return (model, r.runtime, r.precision, r.beam, r.batch)


def _match(
    a: list[ComboResult], b: list[ComboResult]
) -> tuple[list[tuple[ComboResult, ComboResult]], list[ComboResult], list[ComboResult]]:
    """Pairs of results describing the same combination: first by combination and bundle directory name, then, among
    the rest, by combination alone where it is unambiguous on both sides (the same bundle copied to another path)."""
    full_b = {(*_key(r), Path(r.bundle).name): r for r in b}
    pairs, rest_a = [], []
    for r in a:
        partner = full_b.pop((*_key(r), Path(r.bundle).name), None)
        if partner is None:
            rest_a.append(r)
        else:
            pairs.append((r, partner))
    rest_b = list(full_b.values())
    count_a = Counter(_key(r) for r in rest_a)
    count_b = Counter(_key(r) for r in rest_b)
    only_a, matched_b = [], set()
    for r in rest_a:
        key = _key(r)
        if count_a[key] == 1 and count_b.get(key) == 1:
            partner = next(x for x in rest_b if _key(x) == key)
            pairs.append((r, partner))
            matched_b.add(id(partner))
        else:
            only_a.append(r)
    only_b = [r for r in rest_b if id(r) not in matched_b]
    return pairs, only_a, only_b


def _environment_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    fields = ("cpu", "physical_cores", "usable_cpus", "torch_threads", "jetson", "power_mode", "cpu_governor")
    out = {f: (a.get(f), b.get(f)) for f in fields if a.get(f) != b.get(f)}
    va, vb = a.get("versions") or {}, b.get("versions") or {}
    for name in sorted(set(va) | set(vb)):
        if va.get(name) != vb.get(name):
            out[f"versions.{name}"] = (va.get(name), vb.get(name))
    gpus_a = [g.get("name") for g in a.get("gpus") or []]
    gpus_b = [g.get("name") for g in b.get("gpus") or []]
    if gpus_a != gpus_b:
        out["gpus"] = (gpus_a, gpus_b)
    return out


def compare_reports(
    a: BenchReport, b: BenchReport, *, labels: tuple[str, str] = ("A", "B"), metrics: Sequence[Metric] = METRICS
) -> Comparison:
    """Match the combinations of ``a`` and ``b`` and compute per-metric ratios ``B / A``."""
    pairs, only_a, only_b = _match(list(a.results), list(b.results))
    rows = []
    for ra, rb in pairs:
        values = {}
        for metric in metrics:
            va, vb = metric.read(ra), metric.read(rb)
            values[metric.name] = (va, vb, ratio(vb, va))
        rows.append(Row(_key(ra), (Path(ra.bundle).name, Path(rb.bundle).name), values))
    return Comparison(
        a=labels[0],
        b=labels[1],
        rows=rows,
        only_a=[(*_key(r), Path(r.bundle).name) for r in only_a],
        only_b=[(*_key(r), Path(r.bundle).name) for r in only_b],
        environment=_environment_diff(a.environment, b.environment),
    )


def _fmt(metric: Metric, value: Any) -> str:
    return "–" if value is None else metric.fmt(value)


def format_comparison(comparison: Comparison, metrics: Sequence[Metric] = METRICS) -> str:
    """Markdown: one table of latency/throughput, one of memory/size/quality, then environment differences."""
    by_name = {m.name: m for m in metrics}
    lines = [f"# Benchmark comparison: A = {comparison.a}, B = {comparison.b}", ""]
    lines.append("Ratios are B / A. ↓: lower is better (B/A < 1 means B is better); ↑: higher is better.")
    lines.append("")
    groups = (
        ("Latency and throughput", ("p50_ms", "p90_ms", "images_per_s")),
        ("Memory, size and quality", ("peak_rss_bytes", "gpu_peak_bytes", "size_bytes", "cider_d")),
    )
    keys = [row.key for row in comparison.rows]
    show_bundles = len(set(keys)) != len(keys)  # two bundles of one model: say which is which
    for title, wanted in groups:
        names = tuple(n for n in wanted if n in by_name)
        shown = [n for n in names if any(row.values.get(n, (None, None))[0] is not None for row in comparison.rows)]
        if not comparison.rows or not shown:
            continue
        header = (
            ["bundle A / B", "model", "runtime", "precision", "beam", "batch"]
            if show_bundles
            else ["model", "runtime", "precision", "beam", "batch"]
        )
        for name in shown:
            metric = by_name[name]
            header += [f"{metric.label} {'↓' if metric.lower_is_better else '↑'} A", "B", "B/A"]
        lines += [
            f"## {title}",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * (len(header) - 3 * len(shown)) + "---:|" * 3 * len(shown),
        ]
        for row in comparison.rows:
            cells = [str(k) for k in row.key]
            if show_bundles:
                cells.insert(0, " / ".join(dict.fromkeys(row.bundles)))
            for name in shown:
                va, vb, r = row.values[name]
                cells += [_fmt(by_name[name], va), _fmt(by_name[name], vb), "–" if r is None else f"{r:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if not comparison.rows:
        lines += ["No combination appears in both reports.", ""]
    for label, keys in (("A", comparison.only_a), ("B", comparison.only_b)):
        if keys:
            lines += [f"Only in {label}:", ""]
            lines += [f"- {' '.join(str(k) for k in key)}" for key in keys]
            lines.append("")
    if comparison.environment:
        lines += ["## Environment differences", "", "| field | A | B |", "|---|---|---|"]
        lines += [f"| {name} | {va} | {vb} |" for name, (va, vb) in comparison.environment.items()]
        lines.append("")
    return "\n".join(lines)
