"""The main job, end to end on the built-in default: synthetic scenes → features → train → evaluate → caption."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console


@dataclass(frozen=True)
class QuickstartCfg:
    workdir: Path
    model: str = "acort-xsmall"
    images: int = 2000
    seed: int = 0
    minutes: float = 8.0  # training time budget (the run stops cleanly after the running step)
    epochs: int = 30
    beam: int = 3
    run_dir: Path | None = None  # default: $EDGECAP_HOME/runs/MODEL, so `--model MODEL` finds it later
    device: str = "auto"
    overrides: dict[str, Any] = field(default_factory=dict)


def run_quickstart(cfg: QuickstartCfg, console: Console | None = None) -> dict[str, Any]:
    """Run every stage, reusing finished ones (dataset, feature cache, a completed run) when re-run."""
    from edgecap.cli.features import default_cache_dir
    from edgecap.data.feature_cache import extract_features
    from edgecap.data.synthetic import generate_dataset
    from edgecap.evaluation import print_result
    from edgecap.evaluation.run_eval import evaluate_run
    from edgecap.runs import default_run_dir
    from edgecap.training.config import TrainCfg
    from edgecap.training.loop import resolve_device, train

    console = console or Console()
    timings: dict[str, float] = {}
    data_dir = cfg.workdir / "synthetic"
    dataset_json = data_dir / "dataset.json"

    t0 = time.monotonic()
    if dataset_json.is_file():
        console.print(f"[bold]1/5[/] dataset: reusing {dataset_json}")
    else:
        console.print(f"[bold]1/5[/] dataset: synthesising {cfg.images} scenes (seed {cfg.seed}) into {data_dir}")
        generate_dataset(data_dir, cfg.images, seed=cfg.seed)
    timings["dataset_s"] = time.monotonic() - t0

    t0 = time.monotonic()
    cache_dir = default_cache_dir(data_dir, "tf_efficientnet_lite0", 224)
    console.print(f"[bold]2/5[/] features: EfficientNet-Lite0 (ImageNet, offline) grid features → {cache_dir}")
    extract_features(data_dir, cache_dir)  # resumes, or returns at once when complete
    timings["features_s"] = time.monotonic() - t0

    t0 = time.monotonic()
    run_dir = cfg.run_dir or default_run_dir(cfg.model)
    device = str(resolve_device(cfg.device))
    console.print(f"[bold]3/5[/] training {cfg.model} for up to {cfg.minutes:g} min on {device} → {run_dir}")
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
    console.print(f"[bold]4/5[/] evaluating on the test split with beam {cfg.beam}")
    result, predictions = evaluate_run(run_dir, split="test", beam=cfg.beam, device=device, tokenizer="auto")
    print_result(result, console=console, title=f"{cfg.model} · synthetic test split · beam {cfg.beam}")
    timings["eval_s"] = time.monotonic() - t0

    console.print("[bold]5/5[/] captioning test images from their pixels")
    samples = _caption_samples(run_dir, data_dir, device, cfg.beam, console)

    summary = {
        "model": cfg.model,
        "run_dir": str(run_dir),
        "metrics": result.to_dict()["metrics"],
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "samples": samples,
    }
    (run_dir / "quickstart.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"done: run in {run_dir}; try `edgecap caption IMAGE --model {cfg.model}`")
    return summary


def _caption_samples(run_dir: Path, data_dir: Path, device: str, beam: int, console: Console) -> list[dict]:
    from edgecap.captioner import Captioner
    from edgecap.data.datasets import load_dataset

    records = load_dataset(data_dir).split("test")[:4]
    captioner = Captioner.from_run(run_dir, device=device, beam=beam)
    captions = captioner.batch([r.path for r in records])
    out = []
    for record, text in zip(records, captions, strict=True):
        console.print(f"  {record.path.name}: [green]{text}[/]   (a reference: {' '.join(record.captions[0])})")
        out.append({"image": str(record.path), "caption": text, "reference": " ".join(record.captions[0])})
    return out
