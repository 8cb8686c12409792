"""Benchmark reports: latency, throughput, memory, power, size and quality of bundles across runtimes and precisions.

``run_benchmark(BenchCfg(...)) -> BenchReport`` measures; ``write_report(report, out_dir)`` writes ``report.json``
(``docs/bench-report-schema.md``), ``report.md`` and PNG plots; ``compare_reports`` puts two reports side by side;
``run_series``/``summarise_series`` judge a speed-up over several reports.
Modules are imported on first use, so ``import edgecap.bench`` costs nothing.
"""

from __future__ import annotations

from edgecap.runtime._lazy import lazy_dir, lazy_getattr

_LAZY: dict[str, str] = {
    "BenchCfg": "edgecap.bench.config",
    "BenchCfgError": "edgecap.bench.config",
    "run_benchmark": "edgecap.bench.run",
    "BenchReport": "edgecap.bench.results",
    "ComboResult": "edgecap.bench.results",
    "ReportError": "edgecap.bench.results",
    "SCHEMA_VERSION": "edgecap.bench.results",
    "format_markdown": "edgecap.bench.markdown",
    "load_report": "edgecap.bench.report",
    "write_report": "edgecap.bench.report",
    "Comparison": "edgecap.bench.compare",
    "compare_reports": "edgecap.bench.compare",
    "format_comparison": "edgecap.bench.compare",
    "SeriesSummary": "edgecap.bench.series",
    "run_series": "edgecap.bench.series",
    "summarise_series": "edgecap.bench.series",
    "LatencyStats": "edgecap.bench.harness",
    "LoopCfg": "edgecap.bench.harness",
    "TimedStepModel": "edgecap.bench.harness",
    "TimedRefineModel": "edgecap.bench.harness",
    "run_loop": "edgecap.bench.harness",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
__dir__ = lazy_dir(globals(), _LAZY)
