"""``report.md``: the tables a person reads, from a :class:`~edgecap.bench.results.BenchReport` (no measuring here).

Each table is a list of columns ``(header, alignment, cell function)``, so adding a column is one line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from edgecap.bench.compression import compression_lines
from edgecap.bench.ratios import ratio_lines
from edgecap.bench.results import BenchReport, ComboResult
from edgecap.runtime.precisions import PRECISIONS

__all__ = ["fmt_count", "fmt_mib", "fmt_ms", "fmt_num", "format_markdown"]

#: header, alignment (``"l"``/``"r"``), cell text of a result.
Column = tuple[str, str, Callable[[ComboResult], str]]


# -- number formats --------------------------------------------------------------------------------------------------
def fmt_ms(value: float | None) -> str:
    """Milliseconds with about three significant digits (0.123, 1.23, 12.3, 123)."""
    if value is None:
        return "–"
    if value < 1:
        return f"{value:.3f}"
    if value < 10:
        return f"{value:.2f}"
    if value < 100:
        return f"{value:.1f}"
    return f"{value:.0f}"


def fmt_mib(value: int | float | None) -> str:
    """Bytes as MiB with one decimal."""
    return "–" if value is None else f"{value / (1 << 20):.1f}"


def fmt_num(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def fmt_count(value: int | None) -> str:
    """Parameter counts: 950, 44.7 k, 3.21 M."""
    if value is None:
        return "–"
    if value >= 1e6:
        return f"{value / 1e6:.2f} M"
    if value >= 1e3:
        return f"{value / 1e3:.1f} k"
    return str(value)


# -- columns ---------------------------------------------------------------------------------------------------------
def _speedup(r: ComboResult) -> str:
    if r.speedup_vs_rerun is None:
        return "–"
    reference = (r.speedup_reference or "").rsplit(" ", 1)[-1]
    other = f" (vs {reference})" if reference and reference != r.precision else ""
    return f"{r.speedup_vs_rerun:.2f}×{other}"


def _p50_ci(r: ComboResult) -> str:
    ci = r.latency.p50_ci95_ms
    return "–" if ci is None else f"{fmt_ms(ci[0])}–{fmt_ms(ci[1])}"


def _backbone(r: ComboResult) -> str:
    if r.backbone == "torch":
        return fmt_ms(r.breakdown.backbone_ms)
    return "in encoder" if r.backbone == "graph" else "–"


def _power(r: ComboResult, read: Callable[[Any], float | None], digits: int) -> str:
    return fmt_num(read(r.power) if r.power is not None else None, digits)


#: The environment record's keys in reports written before they were renamed: today's key -> the earlier one.
_RENAMED_ENV_KEYS = {"onnxruntime_providers": "ort_providers"}


def _onnxruntime_providers(env: Mapping[str, Any]) -> list[str]:
    """The environment's ONNX Runtime providers, under today's key or, in an older report, the earlier one."""
    key = "onnxruntime_providers"
    return list(env.get(key, env.get(_RENAMED_ENV_KEYS[key])) or [])


def _onnxruntime_threads(r: ComboResult) -> str:
    """ONNX Runtime's threading of the row: ``1, no spin`` (intra-op threads, 0 = ONNX Runtime's default; spinning),
    plus ``threads="auto"``'s split decodes and wide session: ``1, no spin; batches in 2 chunks; 2 from encoder 2 / step
    48 rows``."""
    if not r.threads:
        return "–"
    spin = {True: "spin", False: "no spin", None: "default spin"}[r.threads.get("spin")]
    text = f"{r.threads.get('intra_op')}, {spin}"
    chunks = int(r.threads.get("decode_workers") or 1)  # absent in reports written before split decodes
    if chunks > 1:
        text += f"; batches in {chunks} chunks"
    wide = r.threads.get("wide")
    if wide:
        rows = " / ".join(f"{role} {n}" for role, n in dict(wide["from_rows"]).items())
        text += f"; {wide['intra_op']}{' spin' if wide['spin'] else ''} from {rows} rows"
    return text


def _params(r: ComboResult) -> str:
    backbone = r.size.backbone_parameters
    return fmt_count(r.size.parameters) + (f" + {fmt_count(backbone)} backbone" if backbone else "")


def _quality(r: ComboResult, read: Callable[[Any], str]) -> str:
    return "–" if r.quality is None else read(r.quality)


def _delta(q: Any) -> str:
    return "–" if q.delta_to_fp32 is None else f"{q.delta_to_fp32 * 100:+.1f}"


def _ratio(q: Any) -> str:
    return "–" if q.ratio_to_fp32 is None else f"{q.ratio_to_fp32 * 100:.1f} %"


LABEL: list[Column] = [
    ("model", "l", lambda r: r.model),
    ("runtime", "l", lambda r: r.runtime),
    ("precision", "l", lambda r: r.precision),
    ("beam", "r", lambda r: str(r.beam)),
]
BATCH: Column = ("batch", "r", lambda r: str(r.batch))
LEVEL: Column = ("length level", "r", lambda r: "–" if r.length_level is None else str(r.length_level))
SPEEDUP: Column = ("speed-up vs re-run prefix", "r", _speedup)
THREADS: Column = ("ONNX Runtime threads", "l", _onnxruntime_threads)

SINGLE_STREAM: list[Column] = [
    *LABEL,
    ("p50 ms", "r", lambda r: fmt_ms(r.latency.p50_ms)),
    ("p90 ms", "r", lambda r: fmt_ms(r.latency.p90_ms)),
    ("p99 ms", "r", lambda r: fmt_ms(r.latency.p99_ms) + ("" if r.latency.count >= 100 else "*")),
    ("mean ± sd ms", "r", lambda r: f"{fmt_ms(r.latency.mean_ms)} ± {fmt_ms(r.latency.stdev_ms)}"),
    ("rel sd", "r", lambda r: fmt_num(r.latency.rel_stdev_pct, 1, " %")),
    ("p50 95 % CI", "r", _p50_ci),
    ("n", "r", lambda r: str(r.latency.count)),
    THREADS,
    SPEEDUP,
]
OFFLINE: list[Column] = [
    *LABEL,
    BATCH,
    ("images/s", "r", lambda r: fmt_num(r.throughput.images_per_s, 2)),
    ("captions/s", "r", lambda r: fmt_num(r.throughput.captions_per_s, 2)),
    ("tokens/s", "r", lambda r: fmt_num(r.throughput.tokens_per_s, 1)),
    ("ms/image (p50)", "r", lambda r: fmt_ms(r.per_image_p50_ms)),
    ("batch p50 ms", "r", lambda r: fmt_ms(r.latency.p50_ms)),
    ("batch p90 ms", "r", lambda r: fmt_ms(r.latency.p90_ms)),
    THREADS,
    SPEEDUP,
]
BREAKDOWN: list[Column] = [
    *LABEL,
    BATCH,
    ("backbone", "r", _backbone),
    ("encoder", "r", lambda r: fmt_ms(r.breakdown.encoder_ms)),
    ("decoder", "r", lambda r: fmt_ms(r.breakdown.decoder_ms)),
    ("ms/step", "r", lambda r: fmt_ms(r.breakdown.decoder_step_ms)),
    ("steps", "r", lambda r: fmt_num(r.breakdown.steps, 1)),
    ("select", "r", lambda r: fmt_ms(r.breakdown.select_ms)),
    ("search overhead", "r", lambda r: fmt_ms(r.breakdown.search_overhead_ms)),
    ("TTFT", "r", lambda r: fmt_ms(r.breakdown.ttft_ms)),
    ("tokens/caption", "r", lambda r: fmt_num(r.breakdown.tokens_per_caption, 1)),
    ("preprocess ms/image (untimed)", "r", lambda r: fmt_ms(r.breakdown.preprocess_ms_per_image)),
]
RESOURCES: list[Column] = [
    *LABEL,
    BATCH,
    ("peak RSS MiB", "r", lambda r: fmt_mib(r.memory.rss_peak_bytes)),
    ("Δ RSS MiB", "r", lambda r: fmt_mib(r.memory.rss_delta_bytes)),
    ("GPU alloc peak MiB", "r", lambda r: fmt_mib(r.memory.gpu_allocated_peak_bytes)),
    ("GPU process peak MiB", "r", lambda r: fmt_mib(r.memory.gpu_process_peak_bytes)),
    ("unified used peak MiB", "r", lambda r: fmt_mib(r.memory.unified_used_peak_bytes)),
    ("power mW", "r", lambda r: _power(r, lambda p: p.total_mean_mw, 0)),
    ("mJ/image", "r", lambda r: _power(r, lambda p: p.energy_per_image_mj, 1)),
    ("size MiB", "r", lambda r: fmt_mib(r.size.bytes)),
    ("params", "r", _params),
    ("load s", "r", lambda r: fmt_num(r.load_s, 2)),
]
QUALITY: list[Column] = [
    *LABEL,
    ("CIDEr-D ×100", "r", lambda r: _quality(r, lambda q: f"{q.score * 100:.1f}")),
    ("Δ vs FP32", "r", lambda r: _quality(r, _delta)),
    ("% of FP32", "r", lambda r: _quality(r, _ratio)),
    ("FP32 reference", "l", lambda r: _quality(r, lambda q: q.reference or "–")),
    ("images", "r", lambda r: _quality(r, lambda q: str(q.images))),
    ("set", "l", lambda r: _quality(r, lambda q: q.set)),
]


def table(columns: Sequence[Column], results: Iterable[ComboResult]) -> list[str]:
    """A markdown table, one row per result; a ``length level`` label column follows ``beam`` when any result was
    measured at a level (LaBERT, ``*-len`` bundles)."""
    results = list(results)
    if any(r.length_level is not None for r in results):
        at = next((i + 1 for i, c in enumerate(columns) if c[0] == "beam"), len(columns))
        columns = [*columns[:at], LEVEL, *columns[at:]]
    lines = [
        "| " + " | ".join(c[0] for c in columns) + " |",
        "|" + "|".join("---:" if c[1] == "r" else "---" for c in columns) + "|",
    ]
    lines.extend("| " + " | ".join(c[2](r) for c in columns) + " |" for r in results)
    return lines


# -- sections --------------------------------------------------------------------------------------------------------
def _runtime_order() -> dict[str, int]:
    """Report order of the runtimes: baselines first, then the registry's ``auto`` order reversed (the runtime a
    deployment would pick comes last, next to the baseline it is compared with)."""
    from edgecap.runtime.backends.registry import list_runtimes

    return {name: i for i, name in enumerate(reversed(list_runtimes()))}


def _sorted(results: Iterable[ComboResult]) -> list[ComboResult]:
    runtime = _runtime_order()
    precision = {name: i for i, name in enumerate(PRECISIONS)}
    return sorted(
        results,
        key=lambda r: (
            r.model,
            r.bundle,
            r.beam,
            r.length_level or 0,
            runtime.get(r.runtime, 9),
            precision.get(r.precision, 9),
            r.batch,
        ),
    )


def _environment_lines(env: Mapping[str, Any]) -> list[str]:
    versions = env.get("versions") or {}
    smi = env.get("nvidia_smi") or {}
    lines = [
        f"- CPU: {env.get('cpu')} — {env.get('physical_cores') or '?'} physical cores, "
        f"{env.get('logical_cpus')} logical, {env.get('usable_cpus')} usable by this process; "
        f"governor {env.get('cpu_governor') or 'n/a'}",
        f"- Threads: torch {env.get('torch_threads')} intra-op / {env.get('torch_interop_threads')} inter-op"
        + (f", requested {env['threads_requested']}" if env.get("threads_requested") is not None else "")
        + f"; OMP_NUM_THREADS={env.get('omp_num_threads') or 'unset'}",
        f"- Memory: {fmt_mib(env.get('memory_bytes'))} MiB; load average at start {env.get('loadavg')}",
        "- Software: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v),
        f"- ONNX Runtime providers: {', '.join(_onnxruntime_providers(env)) or 'onnxruntime not installed'}",
    ]
    gpus = env.get("gpus") or []
    if gpus:
        names = "; ".join(
            f"{g['name']} ({fmt_mib(g['memory_bytes'])} MiB, sm {'.'.join(map(str, g['capability']))})" for g in gpus
        )
        lines.append(f"- GPU: {names}; CUDA {env.get('torch_cuda')}, driver {smi.get('driver') or 'n/a'}")
    else:
        lines.append("- GPU: none used (CUDA not available to torch)")
    if env.get("jetson"):
        lines.append(
            f"- Jetson: {env['jetson']}; {env.get('l4t_release') or 'L4T release unknown'}; "
            f"power mode {env.get('power_mode') or 'unknown (nvpmodel not readable)'}"
        )
    lines.append(f"- Platform: {env.get('platform')}")
    return lines


def _memory_note(report: BenchReport, results: Sequence[ComboResult]) -> str:
    scopes = {r.memory.rss_peak_scope for r in results}
    reset = (
        "reset before each combination."
        if scopes == {"combination"}
        else "since the process started (it could not be reset here), so later combinations include earlier peaks."
    )
    process = (
        " Each bundle × runtime × precision ran in a fresh process."
        if report.config.get("isolate")
        else " All combinations shared one process, so baselines include models loaded before."
    )
    return (
        f"Peak RSS is the kernel high-water mark (VmHWM) {reset}{process} "
        "Δ RSS = peak − RSS at the start of the combination (model already loaded)."
    )


def _fallback_lines(results: Sequence[ComboResult]) -> list[str]:
    """A warning above the tables for every runtime/precision whose requested execution providers did not start:
    its rows were measured on what ran (the CPU), not on the GPU the run asked for."""
    seen: dict[tuple[str, str, str], ComboResult] = {}
    for r in results:
        if r.provider_fallback:
            seen.setdefault((r.bundle, r.runtime, r.precision), r)
    if not seen:
        return []
    lines = ["## Execution providers that did not start", ""]
    for (bundle, runtime, precision), r in seen.items():
        fallback = r.provider_fallback or {}
        lines.append(
            f"- **{runtime} {precision} on {Path(bundle).name}** ran on {', '.join(fallback.get('in_use') or [])}, "
            f"not {', '.join(fallback.get('requested') or [])}: {fallback.get('cause') or 'no cause given'}"
        )
    return [*lines, ""]


def format_markdown(report: BenchReport, plots: Mapping[str, str | Path] | None = None) -> str:
    """``report.md``: headline ratios, single-stream latency, offline throughput, time split, memory/size/power,
    quality, skipped and failed combinations, environment, bundles and notes; ``plots`` (name -> file) are
    embedded after the tables."""
    cfg = report.config
    results = _sorted(report.results)
    version = (report.environment.get("versions") or {}).get("edgecap")
    lines = [
        "# edgecap benchmark report",
        "",
        f"Created {report.created} with edgecap {version} (report schema {report.schema_version}).",
    ]
    if report.command:
        lines += ["", f"Command: `{report.command}`"]
    inputs = f"images from {cfg['images']}" if cfg.get("images") else f"{cfg.get('synthetic')} synthetic inputs"
    lines += [
        "",
        f"Measurement: {cfg.get('warmup')} untimed warm-up queries, then timed queries until at least "
        f"{cfg.get('min_repeats')} queries **and** {cfg.get('min_seconds')} s (at most {cfg.get('max_repeats')}); "
        f"inputs: {inputs}, cycled. A query is one batch end to end, from encoder inputs (pixels when the bundle "
        "has its backbone, else features) to caption strings.",
        "",
    ]
    lines += _fallback_lines(results)
    lines += ratio_lines(results, report.bundles)
    single = [r for r in results if r.batch == 1]
    if single:
        lines += ["## Single-stream latency (batch 1, one image per query; MLPerf SingleStream reports p90)", ""]
        lines += table(SINGLE_STREAM, single)
        if any(r.latency.count < 100 for r in single):
            lines += ["", "\\* fewer than 100 samples: p99 is interpolated among the largest values, an estimate."]
        lines.append("")
    if results:
        lines += ["## Offline throughput (batched)", "", *table(OFFLINE, results), ""]
        lines += ["## Where the time goes (mean ms per query)", "", *table(BREAKDOWN, results), ""]
        lines += ["## Memory, size and power", "", *table(RESOURCES, results), "", _memory_note(report, results), ""]
    first_quality: dict[tuple[str, str, str, int, int | None], ComboResult] = {}
    for r in results:
        if r.quality is not None:
            first_quality.setdefault((r.bundle, r.runtime, r.precision, r.beam, r.length_level), r)
    if first_quality:
        lines += ["## Quality (separate, untimed run on a fixed subset)", ""]
        lines += [*table(QUALITY, first_quality.values()), ""]
    lines += compression_lines(report, fmt_ms)
    unmeasured = [b for b in report.bundles if b.quality_note]
    if unmeasured:
        lines += ["Quality not measured for: " + "; ".join(f"{b.name} ({b.quality_note})" for b in unmeasured), ""]
    for name, path in (plots or {}).items():
        lines += [f"![{name.replace('_', ' ')}]({Path(path).name})", ""]
    if report.skipped:
        lines += ["## Skipped combinations", ""]
        lines += [f"- {s.runtime} {s.precision} on {Path(s.bundle).name}: {s.reason}" for s in report.skipped]
        lines.append("")
    if report.errors:
        lines += ["## Errors", ""]
        for s in report.errors:
            where = f" beam {s.beam} batch {s.batch}" if s.batch is not None else ""
            lines.append(f"- {s.runtime} {s.precision}{where} on {Path(s.bundle).name}: {s.reason}")
        lines.append("")
    lines += ["## Environment", "", *_environment_lines(report.environment), ""]
    if report.bundles:
        lines += ["## Bundles", ""]
        for b in report.bundles:
            lines.append(
                f"- {b.name} ({b.family or '?'}, {fmt_count(b.parameters)} parameters) at `{b.path}`: "
                f"{', '.join(b.precisions)}; input {b.input}"
                + (f", backbone {b.backbone}" if b.backbone else "")
                + (f"; quality set: {b.quality_set}" if b.quality_set else "")
            )
        lines.append("")
    if report.notes:
        lines += ["## Notes", "", *(f"- {n}" for n in report.notes), ""]
    return "\n".join(lines)
