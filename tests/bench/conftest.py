"""Fixtures of the bench tests: hand-made results/reports with known numbers, and one tiny real bundle.

``tiny_bundle`` is exported once per session from a random ``ort-test`` model trained on nothing, whose config points at
the session's synthetic dataset and region features (``tiny_data``), so the benchmark finds a quality set on its own.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from edgecap.bench.harness import LatencyStats
from edgecap.bench.memory import MemoryStats
from edgecap.bench.report import (
    SCHEMA_VERSION,
    BenchReport,
    Breakdown,
    BundleInfo,
    ComboResult,
    LoopInfo,
    Quality,
    SizeInfo,
    Throughput,
)


def make_result(
    runtime: str = "torch",
    precision: str = "fp32",
    beam: int = 3,
    batch: int = 1,
    times_ms: tuple[float, ...] = (10.0, 12.0, 11.0, 30.0),
    quality: float | None = None,
    bundle: str = "/bundles/acort",
    model: str = "acort-xsmall",
    rss: int = 400 << 20,
    size: int = 5 << 20,
) -> ComboResult:
    """A result whose latency statistics come from ``times_ms`` (so ratios between results are known exactly)."""
    latency = LatencyStats.from_seconds([t / 1e3 for t in times_ms])
    timed_s = sum(times_ms) / 1e3
    images = batch * len(times_ms)
    return ComboResult(
        bundle=bundle,
        model=model,
        runtime=runtime,
        precision=precision,
        beam=beam,
        batch=batch,
        scenario="single-stream" if batch == 1 else "offline",
        device="cpu",
        providers=["CPUExecutionProvider"] if runtime == "onnxruntime" else None,
        input="features",
        backbone=None,
        latency=latency,
        per_image_p50_ms=latency.p50_ms / batch,
        throughput=Throughput(images / timed_s, images / timed_s, 9 * images / timed_s),
        breakdown=Breakdown(
            backbone_ms=None,
            encoder_ms=1.0,
            decoder_ms=8.0,
            decoder_step_ms=0.8,
            select_ms=0.5,
            search_overhead_ms=0.5,
            ttft_ms=1.8,
            steps=10.0,
            hypothesis_steps=30.0,
            tokens_per_caption=9.0,
            words_per_caption=9.0,
        ),
        memory=MemoryStats(
            rss_baseline_bytes=rss - (8 << 20),
            rss_peak_bytes=rss,
            rss_peak_scope="combination",
            rss_delta_bytes=8 << 20,
        ),
        power=None,
        size=SizeInfo(size, ["weights.safetensors"], 1_000_000),
        quality=None if quality is None else Quality("CIDEr-D", quality, 20, "test split of data, first 20", beam),
        speedup_vs_rerun=None,
        speedup_reference=None,
        loop=LoopInfo(2, len(times_ms), timed_s, [50.0, 12.0]),
        load_s=0.25,
        timings_ms=list(times_ms),
    )


def make_report(results: list[ComboResult], **environment: Any) -> BenchReport:
    env = {
        "cpu": "Test CPU",
        "physical_cores": 2,
        "logical_cpus": 2,
        "usable_cpus": 2,
        "torch_threads": 1,
        "versions": {"edgecap": "0.1.0", "torch": "2.0"},
        "gpus": [],
        **environment,
    }
    return BenchReport(
        schema_version=SCHEMA_VERSION,
        created="2026-01-01T00:00:00+00:00",
        config={
            "warmup": 2,
            "min_repeats": 4,
            "min_seconds": 0.0,
            "max_repeats": 100,
            "synthetic": 8,
            "images": None,
            "isolate": True,
        },
        environment=env,
        bundles=[
            BundleInfo("/bundles/acort", "acort-xsmall", "acort", 1_000_000, ["fp32", "int8"], "features", None, [])
        ],
        results=results,
        notes=["a note"],
        command="edgecap bench --bundle /bundles/acort --out out",
    )


def replace(result: ComboResult, **changes: Any) -> ComboResult:
    return dataclasses.replace(result, **changes)


@pytest.fixture(scope="session")
def tiny_bundle(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A verified FP32 bundle of a random ``ort-test`` (24-d region features, word vocab from the dataset)."""
    from edgecap.runtime.vocab import build_vocab
    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.export.bundle import export_bundle
    from edgecap.workshop.models import create_model
    from edgecap.workshop.runs import TrainedRun

    data, features = tiny_data
    dataset = load_dataset(data)
    vocab = build_vocab([c for r in dataset.split("train") for c in r.captions], kind="word", min_count=1)
    torch.manual_seed(0)
    model = create_model("ort-test", vocab_size=vocab.size, feature_dim=24).eval()
    config = {
        "model": {"name": "ort-test", "vocab_size": vocab.size, "feature_dim": 24, "overrides": {}},
        "train": {"max_words": 8},
        "data": str(data),
        "features": str(features),
    }
    root = tmp_path_factory.mktemp("bench")
    run = TrainedRun(path=root / "run", model=model, vocab=vocab, config=config)
    return export_bundle(run, root / "bundle", progress=False, quality_images=0)
