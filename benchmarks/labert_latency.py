"""Decoding latency vs caption length on ONNX Runtime: LaBERT mask-predict against autoregressive beam-1/beam-3.

LaBERT (§3.2, Table 3) claims a 2.1–2.5× speed-up at the longest level from step counts alone (T = 10 or 12 refine
passes instead of ~25 autoregressive steps). This script measures wall-clock instead: both trained runs are exported
to FP32 ONNX, then each test image is captioned at batch 1 at every length level,

- LaBERT with mask-predict at T = 10 and at the per-level default T (10/15/20/25),
- the length-aware autoregressive run with greedy (beam 1) and beam 3 search,

all through the shared decoding package (``decode``) on ``OrtRuntime`` sessions with one intra-op thread. Reported per
level: the median milliseconds per image, the mean caption length in words, and the model passes per caption
(refine passes, or autoregressive steps of the longest beam).

Usage::

    python benchmarks/labert_latency.py --labert RUN --ar RUN --data DATASET --features FEATURES --images 50 \\
        --out docs/bench/labert/latency.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from edgecap._io import atomic_write_json
from edgecap.captioning import decode_cfg_for
from edgecap.decoding import decode
from edgecap.export.onnx import export_onnx
from edgecap.runs import load_run


def _images(data: str, features: str, split: str, count: int) -> list[dict[str, torch.Tensor]]:
    from edgecap.data.datasets import load_dataset
    from edgecap.data.sources import open_feature_source
    from edgecap.training.batches import FeatureBank

    records = load_dataset(data).split(split)[:count]
    bank = FeatureBank(open_feature_source(features), [r.image_id for r in records])
    return [bank.batch([i]).as_inputs() for i in range(len(records))]


def _time(model: Any, images: list[dict[str, torch.Tensor]], cfg: Any, passes: Any) -> dict[str, float]:
    times, words, steps = [], [], []
    decode(model, images[0], cfg)  # warm-up (session allocation)
    for inputs in images:
        start = time.perf_counter()
        (hyps,) = decode(model, inputs, cfg)
        times.append((time.perf_counter() - start) * 1e3)
        words.append(len(hyps[0].tokens))
        steps.append(passes(hyps[0]))
    return {
        "ms_p50": round(statistics.median(times), 3),
        "ms_mean": round(statistics.fmean(times), 3),
        "tokens_mean": round(statistics.fmean(words), 2),
        "passes_mean": round(statistics.fmean(steps), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labert", required=True, help="trained LaBERT run directory")
    parser.add_argument("--ar", required=True, help="trained length-aware autoregressive run directory")
    parser.add_argument("--data", required=True)
    parser.add_argument("--features", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--images", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from edgecap.runtimes.onnxruntime_session import create_ort_step_model
    from edgecap.runtimes.refine import create_ort_refine_model

    images = _images(args.data, args.features, args.split, args.images)
    labert, ar = load_run(args.labert), load_run(args.ar)
    options = {"intra_op_threads": args.threads, "session_config": {"session.intra_op.allow_spinning": "0"}}
    lab_graphs = export_onnx(labert.model, precisions=("fp32",), parity=False).runtime_models("fp32")
    ar_graphs = export_onnx(ar.model, precisions=("fp32",), parity=False).runtime_models("fp32")
    results: dict[str, Any] = {"images": len(images), "threads": args.threads, "levels": {}}
    levels = labert.model.levels
    tpw = ar.vocab.tokens_per_word
    with (
        create_ort_refine_model(**lab_graphs, **options) as refine_model,
        create_ort_step_model(**ar_graphs, **options) as step_model,
    ):
        for level, (low, high) in enumerate(levels, start=1):
            row: dict[str, Any] = {"range": [low, high]}
            default_t = labert.model.cfg.refine_steps[level - 1]
            for name, steps in (("mask_predict_T10", 10), (f"mask_predict_T{default_t}", default_t)):
                cfg = decode_cfg_for(labert.vocab, strategy="mask_predict", length_level=level, refine_steps=steps)
                row[name] = _time(refine_model, images, cfg, lambda h, s=steps: s)
            for beam in (1, 3):
                cfg = decode_cfg_for(ar.vocab, beam_size=beam, max_words=high, length_level=level)
                result = _time(step_model, images, cfg, lambda h: len(h.tokens) + int(h.finished))
                result["tokens_mean"] = round(result["tokens_mean"] / tpw, 2)  # words (radix: digits per word)
                row[f"ar_beam{beam}"] = result
            results["levels"][str(level)] = row
            print(level, row, flush=True)
    atomic_write_json(args.out, results)


if __name__ == "__main__":
    main()
