"""The main job, end to end on the built-in default: synthetic scenes → features → train → evaluate → caption →
export (a pixels-in FP32/FP16/INT8 bundle, EfficientNet-Lite0 inside its encoder graph, with its parity and quality
table) → caption through the bundle → benchmark.

It strings both halves, the benchmark and the feature cache's CLI defaults together, so it lives above them all, with
the commands (``edgecap quickstart``): the workshop half never imports the benchmark or the CLI."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from rich.console import Console

from edgecap.runtime._io import atomic_write_json


@dataclass(frozen=True)
class QuickstartCfg:
    workdir: Path
    model: str = "acort-xsmall"
    images: int = 2000
    seed: int = 0
    epochs: int = 12  # a fixed amount of work, so scores do not depend on machine load (~8 min on 2 idle cores)
    minutes: float = 0.0  # optional time cap (0 = none); the run stops cleanly after the running step
    beam: int = 3
    run_dir: Path | None = None  # default: $EDGECAP_HOME/runs/MODEL, so `--model MODEL` finds it later
    device: str = "auto"
    overrides: dict[str, Any] = field(default_factory=dict)
    bundle_dir: Path | None = None  # default: $EDGECAP_HOME/bundles/MODEL
    calib_size: int = 128  # INT8 calibration images (from the train split)


def run_quickstart(cfg: QuickstartCfg, console: Console | None = None) -> dict[str, Any]:
    """Run every stage, reusing finished ones (dataset, feature cache, a completed run) when re-run."""
    from edgecap.cli.features import default_cache_dir
    from edgecap.runtime.bundle.layout import default_bundle_dir
    from edgecap.workshop.data.feature_cache import extract_features
    from edgecap.workshop.data.synthetic import generate_dataset
    from edgecap.workshop.evaluation import print_result
    from edgecap.workshop.evaluation.run_eval import evaluate_run
    from edgecap.workshop.export import require_onnx_stack
    from edgecap.workshop.export.report import bundle_table
    from edgecap.workshop.run_layout import default_run_dir
    from edgecap.workshop.torch_runtime.runtime import resolve_device
    from edgecap.workshop.training.config import TrainCfg
    from edgecap.workshop.training.determinism import make_deterministic
    from edgecap.workshop.training.loop import train

    require_onnx_stack()  # stage 6 exports: say what to install before training for minutes
    console = console or Console()
    timings: dict[str, float] = {}
    data_dir = cfg.workdir / "synthetic"
    dataset_json = data_dir / "dataset.json"

    t0 = time.monotonic()
    if dataset_json.is_file():
        console.print(f"[bold]1/7[/] dataset: reusing {dataset_json}")
    else:
        console.print(f"[bold]1/7[/] dataset: synthesising {cfg.images} scenes (seed {cfg.seed}) into {data_dir}")
        generate_dataset(data_dir, cfg.images, seed=cfg.seed)
    timings["dataset_s"] = time.monotonic() - t0

    t0 = time.monotonic()
    cache_dir = default_cache_dir(data_dir, "tf_efficientnet_lite0", 224)
    console.print(f"[bold]2/7[/] features: EfficientNet-Lite0 (ImageNet, offline) grid features → {cache_dir}")
    make_deterministic(device=resolve_device(cfg.device))  # before the first torch work
    extract_features(data_dir, cache_dir)  # resumes, or returns at once when complete
    timings["features_s"] = time.monotonic() - t0

    t0 = time.monotonic()
    run_dir = cfg.run_dir or default_run_dir(cfg.model)
    device = str(resolve_device(cfg.device))
    budget = f"{cfg.epochs} epochs" + (f" (at most {cfg.minutes:g} min)" if cfg.minutes else "")
    console.print(f"[bold]3/7[/] training {cfg.model} for {budget} on {device} → {run_dir}")
    train_cfg = TrainCfg(
        model=cfg.model,
        data=str(data_dir),
        features=str(cache_dir),
        out=str(run_dir),
        epochs=cfg.epochs,
        max_minutes=cfg.minutes,
        seed=cfg.seed,
        device=device,
        model_overrides=dict(cfg.overrides),
    )
    train(train_cfg)
    timings["train_s"] = time.monotonic() - t0

    t0 = time.monotonic()
    console.print(f"[bold]4/7[/] evaluating on the test split with beam {cfg.beam}")
    result, predictions = evaluate_run(run_dir, split="test", beam=cfg.beam, device=device, tokenizer="auto")
    print_result(result, console=console, title=f"{cfg.model} · synthetic test split · beam {cfg.beam}")
    timings["eval_s"] = time.monotonic() - t0

    console.print("[bold]5/7[/] captioning test images from their pixels")
    samples = _caption_samples(run_dir, data_dir, device, cfg.beam, console)

    t0 = time.monotonic()
    bundle_dir = cfg.bundle_dir or default_bundle_dir(cfg.model)
    console.print(
        f"[bold]6/7[/] export, pixels in (the backbone inside the encoder graph): FP32, FP16 and INT8 (cpu-auto, "
        f"calibrated on up to {cfg.calib_size} train images) → {bundle_dir}"
    )
    bundle = _export_bundle(run_dir, data_dir, bundle_dir, cfg.calib_size, console)
    console.print(bundle_table(bundle))
    bundle_samples = _bundle_samples(bundle.path, samples, cfg.beam, console)
    timings["export_s"] = time.monotonic() - t0

    t0 = time.monotonic()
    bench_dir = bundle.path.parent / f"{bundle.path.name}-bench"
    console.print(
        f"[bold]7/7[/] benchmark: torch vs re-run prefix vs ONNX Runtime, batch 1, beam {cfg.beam} → {bench_dir}"
    )
    bench_files = _benchmark(bundle.path, bench_dir, cfg.beam, console)
    timings["bench_s"] = time.monotonic() - t0

    summary = {
        "model": cfg.model,
        "run_dir": str(run_dir),
        "metrics": result.to_dict()["metrics"],
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "samples": samples,
        "bundle": {"path": str(bundle.path), "variants": bundle.summary(), "samples": bundle_samples},
        "bench_report": str(bench_files["markdown"]),
    }
    atomic_write_json(run_dir / "quickstart.json", summary)
    console.print(
        f"done: run in {run_dir}, bundle in {bundle.path}; try `edgecap caption IMAGE --model {bundle.path}` "
        f"or, in Python, `Captioner.load({str(bundle.path)!r})`"
    )
    return summary


def _export_bundle(run_dir: Path, data_dir: Path, bundle_dir: Path, calib_size: int, console: Console) -> Any:
    """Export the run unless the bundle already holds exactly these weights with all three precisions, pixels in."""
    from edgecap.runtime.bundle import BundleError, load_bundle
    from edgecap.runtime.bundle.manifest import PRECISION_ORDER, sha256_file
    from edgecap.workshop.export.bundle import export_bundle

    wanted = sha256_file(run_dir / "weights.safetensors")
    try:
        existing = load_bundle(bundle_dir, graphs="none")
    except (BundleError, FileNotFoundError):
        existing = None
    if existing is not None:
        same = (existing.config.get("source") or {}).get("weights_sha256") == wanted
        if same and existing.precisions == PRECISION_ORDER and existing.backbone_in_graph:
            console.print(f"  reusing {bundle_dir} (exported from these weights)")
            return existing
    export_bundle(
        run_dir, bundle_dir, fp16=True, int8=True, calib=data_dir, target="cpu-auto", calib_size=calib_size,
        with_backbone=True, overwrite=True,
    )  # fmt: skip
    return load_bundle(bundle_dir, graphs="none")


def _benchmark(bundle_dir: Path, out_dir: Path, beam: int, console: Console) -> dict[str, Path]:
    """A short single-stream report of the bundle (``edgecap bench`` measures more: batches, beams, throughput)."""
    from edgecap.bench import BenchCfg, run_benchmark, write_report

    cfg = BenchCfg(
        bundles=(str(bundle_dir),), batches=(1,), beams=(beam,), quality_images=50, warmup=2, min_repeats=10,
        min_seconds=1.0, threads=1,
    )  # fmt: skip
    files = write_report(run_benchmark(cfg), out_dir)
    console.print(f"  report: {files['markdown']}  (full run: `edgecap bench --bundle {bundle_dir} --out DIR`)")
    return files


def _bundle_samples(bundle_dir: Path, samples: list[dict], beam: int, console: Console) -> list[dict]:
    """The run's sample images captioned again by the bundle on the best available runtime/precision."""
    from edgecap.runtime.captioner import Captioner

    with Captioner.load(bundle_dir, beam=beam) as captioner:
        console.print(f"  the bundle runs on: {captioner.runtime_info['summary']}")
        captions = captioner.batch([s["image"] for s in samples])
    out = []
    for sample, text in zip(samples, captions, strict=True):
        console.print(f"  {Path(sample['image']).name}: [green]{text}[/]   (torch run: {sample['caption']})")
        out.append({"image": sample["image"], "caption": text, "precision": captioner.runtime_info["precision"]})
    return out


def _caption_samples(run_dir: Path, data_dir: Path, device: str, beam: int, console: Console) -> list[dict]:
    from edgecap.runtime.captioner import Captioner
    from edgecap.workshop.data.datasets import load_dataset

    records = load_dataset(data_dir).split("test")[:4]
    captioner = Captioner.from_run(run_dir, device=device, beam=beam)
    captions = captioner.batch([r.path for r in records])
    out = []
    for record, text in zip(records, captions, strict=True):
        image = cast(Path, record.path)  # the quickstart dataset's records are image files
        console.print(f"  {image.name}: [green]{text}[/]   (a reference: {' '.join(record.captions[0])})")
        out.append({"image": str(record.path), "caption": text, "reference": " ".join(record.captions[0])})
    return out
