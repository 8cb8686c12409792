"""PNG plots of a :class:`~edgecap.bench.results.BenchReport` (matplotlib, Agg backend: no display needed).

- ``latency_vs_batch.png``: per-image p50 latency and throughput against batch size, one line per
  model/runtime/precision/beam — where batching stops paying off on this device.
- ``pareto.png``: quality against single-stream latency across every model/runtime/precision, marker area
  proportional to on-disk size, with the Pareto front (nothing else is both faster and better) drawn through it.
- ``compression_pareto.png``: the compressed variants (bundle × precision) by recipe: size vs CIDEr-D and latency vs
  CIDEr-D with both fronts, when more than one variant records a CIDEr-D (:mod:`edgecap.bench.compression`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgecap.bench.compression import pareto_front
from edgecap.bench.results import BenchReport, ComboResult
from edgecap.runtime._io import atomic_path

__all__ = ["pareto_front", "plot_compression_pareto", "plot_latency_vs_batch", "plot_pareto"]


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


def plot_compression_pareto(report: BenchReport, path: str | Path) -> Path | None:
    """The compressed variants of a model: size (MB) vs CIDEr-D and batch-1 latency vs CIDEr-D, side by side, each
    point labelled by its recipe (and its bundle's directory name when two bundles share a recipe) and each Pareto
    front drawn (:func:`edgecap.bench.compression.compression_rows`).

    Returns:
        ``path``, or None when fewer than two variants have both a size and a recorded CIDEr-D.
    """
    from edgecap.bench.compression import bundle_labels, compression_rows, wants_compression_chart

    rows = compression_rows(report)
    if not wants_compression_chart(rows):
        return None
    shared = {r.recipe for r in rows if sum(o.recipe == r.recipe for o in rows) > 1}
    where = bundle_labels(sorted({r.bundle for r in rows}))
    labels = {id(r): f"{r.recipe} ({where[r.bundle]})" if r.recipe in shared else r.recipe for r in rows}
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    panels = (("size_mb", "on_size_front", "size on disk, MB"), ("latency_ms", "on_latency_front", "latency"))
    for ax, (cost, flag, label) in zip(axes, panels, strict=True):
        points = [r for r in rows if getattr(r, cost) is not None and r.cider_d is not None]
        for r in points:
            on = getattr(r, flag)
            ax.scatter(
                [getattr(r, cost)],
                [r.cider_d],
                marker="o" if on else "x",
                color="tab:red" if on else "tab:grey",
                s=50,
                zorder=3,
            )
            xy = (getattr(r, cost), r.cider_d)
            ax.annotate(labels[id(r)], xy, textcoords="offset points", xytext=(6, 4), fontsize=7)
        front = sorted((r for r in points if getattr(r, flag)), key=lambda r: (getattr(r, cost), -(r.cider_d or 0)))
        if len(front) > 1:
            ax.step([getattr(r, cost) for r in front], [r.cider_d for r in front], where="post", color="tab:red")
        if cost == "latency_ms":
            runtimes = sorted({f"{r.runtime} b{r.beam}" for r in points})
            label = f"batch-1 latency, ms per image (p50; {', '.join(runtimes) or 'not measured'})"
        ax.set_xlabel(label)
        ax.set_ylabel("held-out CIDEr-D (manifest record)")
        ax.grid(True, alpha=0.3)
        if not points:
            ax.text(0.5, 0.5, "no variant measured at batch 1", ha="center", va="center", transform=ax.transAxes)
    axes[0].set_title("Size vs CIDEr-D (red: Pareto front)")
    axes[1].set_title("Latency vs CIDEr-D (red: Pareto front)")
    fig.suptitle(", ".join(sorted({r.name for r in rows})) + ": compressed variants", fontsize=10)
    try:
        return _save(fig, Path(path))
    finally:
        plt.close(fig)
