"""Linking a run's results to each other: speed-up against the re-run-prefix baseline, quality against FP32."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from edgecap.bench.results import ComboResult, Quality

__all__ = ["RERUN", "link_results"]

#: The runtime that re-runs the whole prefix each step: the baseline of ``speedup_vs_rerun``.
RERUN = "torch-rerun"


def link_results(results: Sequence[ComboResult]) -> list[ComboResult]:
    """Fill ``speedup_vs_rerun`` and the FP32 quality deltas.

    - speed-up: ``p50(torch-rerun) / p50(this)`` for the same bundle, beam and batch, against the re-run result of
      the same precision, else of FP32 (INT8 has no torch re-run); the baseline's own rows get 1.0.
    - quality: delta and ratio to the FP32 result of the same bundle and beam, on the same runtime when it was
      measured, else on the first other runtime measured at FP32 (torch before onnxruntime).
    """
    from edgecap.runtime.backends.registry import get_runtime, list_runtimes

    rerun = {(r.bundle, r.precision, r.beam, r.batch, r.length_level): r for r in results if r.runtime == RERUN}
    torch_runtimes = [name for name in list_runtimes() if get_runtime(name).torch]
    fp32_quality: dict[tuple[str, int, int | None], dict[str, Quality]] = {}
    for r in results:
        if r.precision == "fp32" and r.quality is not None:
            fp32_quality.setdefault((r.bundle, r.beam, r.length_level), {}).setdefault(r.runtime, r.quality)
    linked = []
    for r in results:
        changes: dict[str, Any] = {}
        key = (r.beam, r.batch, r.length_level)
        base = rerun.get((r.bundle, r.precision, *key)) or rerun.get((r.bundle, "fp32", *key))
        if base is not None and r.latency.p50_ms > 0:
            changes["speedup_vs_rerun"] = base.latency.p50_ms / r.latency.p50_ms
            changes["speedup_reference"] = f"{RERUN} {base.precision}"
        if r.quality is not None:
            refs = fp32_quality.get((r.bundle, r.beam, r.length_level), {})
            order = [r.runtime, *torch_runtimes, *sorted(refs)]
            runtime = next((name for name in order if name in refs), None)
            if runtime is not None:
                ref = refs[runtime]
                changes["quality"] = dataclasses.replace(
                    r.quality,
                    delta_to_fp32=r.quality.score - ref.score,
                    ratio_to_fp32=r.quality.score / ref.score if ref.score > 0 else None,
                    reference=f"{runtime} fp32",
                )
        linked.append(dataclasses.replace(r, **changes) if changes else r)
    return linked
