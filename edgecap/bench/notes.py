"""The methodology notes of a report: what to keep in mind reading these particular numbers."""

from __future__ import annotations

from collections.abc import Sequence

from edgecap.bench.config import BenchCfg
from edgecap.bench.results import BundleInfo, ComboResult

__all__ = ["report_notes"]


def report_notes(cfg: BenchCfg, results: Sequence[ComboResult], bundles: Sequence[BundleInfo] = ()) -> list[str]:
    notes = [
        "Percentiles interpolate linearly between order statistics (numpy's default, as optimum-benchmark); the "
        "p50 95 % CI is distribution-free (order statistics).",
        "A query decodes a whole caption: its number of decode steps depends on the input, so part of the spread "
        "is the inputs' caption lengths, not noise (see 'steps').",
        "Throughput = images in the timed queries / their total time; captions/s counts returned captions (one per "
        "image); tokens/s counts generated tokens of the best hypothesis (EOS included).",
        (
            "Each bundle × runtime × precision ran in a fresh Python process: memory numbers do not "
            "include earlier models."
            if cfg.isolate
            else "All combinations ran in one process: RSS baselines include models loaded earlier in the run."
        ),
    ]
    if cfg.images is None:
        notes.append(
            "Inputs are synthetic (random pixels or region features): caption lengths, and so decode time, can "
            "differ from real images; pass --images DIR for a representative pool."
        )
    heavy = sorted(
        {f"{r.runtime} {r.precision}" for r in results if r.breakdown.search_overhead_ms > 0.5 * r.latency.mean_ms}
    )
    if heavy:
        notes.append(
            f"Search overhead is more than half of the query time for {', '.join(heavy)}: time outside the "
            "encoder/step/select calls (the search's torch ops, processors, detokenisation). On few cores this is "
            "often two thread pools spinning against each other (e.g. ONNX Runtime's and torch's OpenMP threads); "
            "try --threads 1 or OMP_WAIT_POLICY=PASSIVE."
        )
    if any(r.length_level is not None for r in results):
        notes.append(
            "Length-controllable bundles were measured per length level. Mask-predict bundles (LaBERT) run a fixed "
            "number of refinement passes per level, each over the whole caption: 'steps' counts passes and "
            "'decoder' their time; beam search does not apply (beam 1)."
        )
    torch_runs = {b.run for b in bundles if (b.backbone or "").endswith(" in torch")}
    alone = [
        b.path for b in bundles if (b.backbone or "").endswith(" in the encoder graph") and b.run not in torch_runs
    ]
    if alone:
        notes.append(
            f"{', '.join(alone)}: pixels-in, benchmarked without a torch-backbone bundle of the same run, so the "
            "'pixels-in vs torch backbone' ratio is missing; export the same run with its backbone in torch and pass "
            "both bundles (docs/benchmarks.md, 'Pixels-in vs the torch backbone')."
        )
    if any(r.runtime == "onnxruntime" and r.precision == "fp16" and r.device == "cpu" for r in results):
        notes.append(
            "FP16 graphs on ONNX Runtime's CPU provider run with inserted casts and are expected to be slower than "
            "FP32; FP16 is meant for GPUs/NPUs."
        )
    return notes
