"""PNG plots of a :class:`~edgecap.bench.results.BenchReport` (matplotlib, Agg backend: no display needed).

- ``latency_vs_batch.png``: per-image p50 latency and throughput against batch size, one line per
  model/runtime/precision/beam — where batching stops paying off on this device.
- ``pareto.png``: quality against single-stream latency across every model/runtime/precision, marker area
  proportional to on-disk size, with the Pareto front (nothing else is both faster and better) drawn through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgecap.bench.results import BenchReport, ComboResult
from edgecap.runtime._io import atomic_path

__all__ = ["pareto_front", "plot_latency_vs_batch", "plot_pareto"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _plain_numbers(axis: Any) -> None:
    """Log-axis labels as plain numbers (``4``, ``20``) instead of ``4×10⁰``."""
    from matplotlib.ticker import FuncFormatter

    formatter = FuncFormatter(lambda value, _: f"{value:g}")
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(formatter)


def _save(fig: Any, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    return path


def plot_latency_vs_batch(report: BenchReport, path: str | Path) -> Path | None:
    """Per-image p50 latency (with the p90 as the upper whisker) and images/s against batch size.

    Returns:
        ``path``, or None when the report has no results (nothing to plot).
    """
    series: dict[tuple[str, str, str, int, int], list[ComboResult]] = {}
    for r in report.results:
        series.setdefault((r.model, r.runtime, r.precision, r.beam, r.length_level or 0), []).append(r)
    if not series:
        return None
    plt = _pyplot()
    fig, (ax_lat, ax_tput) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (model, runtime, precision, beam, level), rows in sorted(series.items()):
        rows = sorted(rows, key=lambda r: r.batch)
        batches = [r.batch for r in rows]
        p50 = [r.latency.p50_ms / r.batch for r in rows]
        p90 = [r.latency.p90_ms / r.batch for r in rows]
        label = f"{model} {runtime} {precision} beam {beam}" + (f" level {level}" if level else "")
        style = "--" if runtime.endswith("rerun") else "-"
        line = ax_lat.errorbar(
            batches,
            p50,
            yerr=[[0] * len(p50), [b - a for a, b in zip(p50, p90, strict=True)]],
            marker="o",
            linestyle=style,
            capsize=3,
            label=label,
        )
        ax_tput.plot(
            batches,
            [r.throughput.images_per_s for r in rows],
            marker="o",
            linestyle=style,
            color=line.lines[0].get_color(),
            label=label,
        )
    ticks = sorted({r.batch for r in report.results})
    for ax in (ax_lat, ax_tput):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_yscale("log")
        _plain_numbers(ax.yaxis)
        ax.set_xlabel("batch size (images per query)")
        ax.grid(True, which="both", alpha=0.3)
    ax_lat.set_ylabel("ms per image (p50; whisker to p90)")
    ax_lat.set_title("Latency per image vs batch")
    ax_tput.set_ylabel("images / s")
    ax_tput.set_title("Offline throughput vs batch")
    ax_tput.legend(fontsize=7, loc="best")
    device = report.environment.get("cpu") if not report.environment.get("gpus") else report.environment["gpus"][0]
    fig.suptitle(f"edgecap bench — {device if isinstance(device, str) else (device or {}).get('name')}", fontsize=10)
    try:
        return _save(fig, Path(path))
    finally:
        plt.close(fig)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates (lower-or-equal latency *and* higher-or-equal quality, one of
    them strictly), sorted by latency."""
    front = []
    for i, (lat, qual) in enumerate(points):
        dominated = any(
            (lat2 <= lat and q2 >= qual) and (lat2 < lat or q2 > qual) for j, (lat2, q2) in enumerate(points) if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _single_stream(report: BenchReport) -> list[ComboResult]:
    """One result per model/runtime/precision/beam with quality: batch 1 when measured, else its smallest batch."""
    best: dict[tuple[str, str, str, str, int, int | None], ComboResult] = {}
    for r in report.results:
        if r.quality is None:
            continue
        key = (r.bundle, r.model, r.runtime, r.precision, r.beam, r.length_level)
        if key not in best or r.batch < best[key].batch:
            best[key] = r
    return list(best.values())


def plot_pareto(report: BenchReport, path: str | Path) -> Path | None:
    """Quality (CIDEr-D) vs single-stream per-image latency with the Pareto front drawn. Colour = runtime and
    precision, marker shape = model, marker area ∝ size on disk, ``bN`` = beam size; the front's points are labelled.

    Returns:
        ``path``, or None when no result has a quality score (nothing to plot).
    """
    from matplotlib.lines import Line2D

    rows = _single_stream(report)
    if not rows:
        return None
    plt = _pyplot()
    points = [(r.per_image_p50_ms, (r.quality.score if r.quality else 0.0) * 100) for r in rows]
    largest = max(max(r.size.bytes, 1) for r in rows)
    kinds = sorted({(r.runtime, r.precision) for r in rows})
    models = sorted({r.model for r in rows})
    colour = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(kinds)}
    marker = {m: "os^Dvp*hX<>"[i % 11] for i, m in enumerate(models)}
    front = pareto_front(points)
    fig, ax = plt.subplots(figsize=(9, 6))
    for i, (r, (lat, qual)) in enumerate(zip(rows, points, strict=True)):
        ax.scatter(
            [lat],
            [qual],
            s=40 + 500 * max(r.size.bytes, 1) / largest,
            marker=marker[r.model],
            color=colour[r.runtime, r.precision],
            alpha=0.7,
            edgecolors="black",
        )
        tag = f"b{r.beam}" + (f" L{r.length_level}" if r.length_level is not None else "")
        text = tag if i not in front else f"{r.model} {r.runtime} {r.precision} {tag}"
        ax.annotate(text, (lat, qual), textcoords="offset points", xytext=(6, 4), fontsize=7)
    handles = [
        Line2D([], [], linestyle="", marker="o", color=colour[k], label=f"{k[0]} {k[1]}", markersize=8) for k in kinds
    ]
    if len(models) > 1:
        handles += [Line2D([], [], linestyle="", marker=marker[m], color="grey", label=m, markersize=8) for m in models]
    if len(front) > 1:
        ax.step(
            [points[i][0] for i in front],
            [points[i][1] for i in front],
            where="post",
            color="tab:red",
            linewidth=1,
        )
        handles.append(Line2D([], [], color="tab:red", label="Pareto front"))
    ax.legend(handles=handles, fontsize=8, loc="best")
    ax.set_xscale("log")
    _plain_numbers(ax.xaxis)
    ax.set_xlabel("single-stream latency, ms per image (p50)")
    metric = rows[0].quality.metric if rows[0].quality else "quality"
    ax.set_ylabel(f"{metric} ×100")
    ax.set_title("Quality vs latency (marker area ∝ size on disk; bN = beam size)")
    ax.grid(True, which="both", alpha=0.3)
    try:
        return _save(fig, Path(path))
    finally:
        plt.close(fig)
