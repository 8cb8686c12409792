"""Benchmark reports: latency, throughput, memory, power, size and quality of bundles across runtimes and precisions.

``run_benchmark(BenchCfg(...)) -> BenchReport`` measures; ``write_report(report, out_dir)`` writes ``report.json``
(``docs/bench-report-schema.md``), ``report.md`` and PNG plots; ``compare_reports`` puts two reports side by side.
Modules are imported on first use, so ``import edgecap.bench`` costs nothing.
"""

from __future__ import annotations

from edgecap._lazy import lazy_getattr

_LAZY: dict[str, str] = {
    "BenchCfg": "edgecap.bench.run",
    "BenchCfgError": "edgecap.bench.run",
    "run_benchmark": "edgecap.bench.run",
    "BenchReport": "edgecap.bench.report",
    "ComboResult": "edgecap.bench.report",
    "ReportError": "edgecap.bench.report",
    "SCHEMA_VERSION": "edgecap.bench.report",
    "format_markdown": "edgecap.bench.markdown",
    "load_report": "edgecap.bench.report",
    "write_report": "edgecap.bench.report",
    "Comparison": "edgecap.bench.compare",
    "compare_reports": "edgecap.bench.compare",
    "format_comparison": "edgecap.bench.compare",
    "LatencyStats": "edgecap.bench.harness",
    "LoopCfg": "edgecap.bench.harness",
    "TimedStepModel": "edgecap.bench.harness",
    "TimedRefineModel": "edgecap.bench.harness",
    "run_loop": "edgecap.bench.harness",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
