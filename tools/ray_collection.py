"""Benchmark of the Ray Data path (``edgecap caption DIR --ray``) against a direct ``Captioner`` loop (``docs/ray.md``).

    python -m tools.ray_collection --images 2000 --runs 5 --model acort-xsmall

It generates small random PNGs into a temporary folder (removed afterwards), starts one local Ray cluster of this
machine's CPUs, and times ``--runs`` interleaved rounds of two arms, each from start to the last line written (model
loads included, the cluster's start not: it is reported on its own):

- ``direct``: one process, ``Captioner.load(threads=<all CPUs>)``, ``batch`` over every path, JSONL lines written;
- ``ray``: :func:`~edgecap.runtime.collections.ray_job.caption_with_ray` with ``--workers`` actors (``threads``
  ``auto``: each actor one equal share of the CPUs) into a JSONL file.

Every round checks that the Ray file has exactly the direct loop's captions, path for path.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
import numpy as np
from PIL import Image

from tools import run_program

__all__ = ["direct_arm", "main", "make_images"]


def make_images(root: Path, count: int, size: int = 32) -> list[str]:
    """``count`` random ``size`` x ``size`` PNGs in folders of 500, in listing order."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        folder = root / f"{i // 500:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i:06d}.png")
        paths.append(str(folder / f"{i:06d}.png"))
    return paths


def direct_arm(paths: list[str], out: Path, model: str, precision: str, cpus: int) -> dict[str, str]:
    """The direct arm: one ``Captioner`` on ``cpus`` threads over ``paths``, its JSONL lines into ``out``; the
    captions by path."""
    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.collections.journal import record_line

    with Captioner.load(model, precision=precision, threads=cpus) as cap:
        captions = cap.batch(paths, batch_size=16)
    out.write_bytes(b"".join(record_line(p, c) for p, c in zip(paths, captions, strict=True)))
    return {p: c for p, c in zip(paths, captions, strict=True) if c is not None}


def _ray(root: Path, out: Path, model: str, precision: str, workers: int) -> dict[str, str]:
    from edgecap.runtime.collections.ray_job import caption_with_ray

    caption_with_ray(
        [root], out, bundle=Path(model), address=None, recursive=True, resume=False, workers=workers,
        runtime="auto", precision=precision, threads="auto", beam=None, length_level=None,
    )  # fmt: skip
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return {r["path"]: r["caption"] for r in records if "caption" in r}


@click.command(help=__doc__.split("\n")[0])
@click.option("--images", type=click.IntRange(min=1), default=2000, show_default=True)
@click.option("--runs", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True, help="Ray actors.")
@click.option("--model", default="acort-xsmall", show_default=True, help="Bundle path or exported model name.")
@click.option("--precision", default="auto", show_default=True)
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Also write the results here.")
def cli(images: int, runs: int, workers: int, model: str, precision: str, json_out: Path | None) -> int:
    import ray

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    rates: dict[str, list[float]] = {"direct": [], "ray": []}
    identical = True
    with tempfile.TemporaryDirectory(prefix="edgecap-ray-bench-") as tmp:
        root = Path(tmp) / "images"
        paths = make_images(root, images)
        started = time.perf_counter()
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        cluster_s = time.perf_counter() - started
        try:
            for run in range(runs):
                results = {}
                for arm in ("direct", "ray") if run % 2 == 0 else ("ray", "direct"):  # interleaved, order alternating
                    out = Path(tmp) / f"{arm}-{run}.jsonl"
                    begin = time.perf_counter()
                    if arm == "direct":
                        results[arm] = direct_arm(paths, out, model, precision, cpus)
                    else:
                        results[arm] = _ray(root, out, model, precision, workers)
                    rates[arm].append(images / (time.perf_counter() - begin))
                identical = identical and results["direct"] == results["ray"] and len(results["ray"]) == images
        finally:
            ray.shutdown()
    summary: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {cpus} CPUs ({platform.processor() or platform.platform()})",
        "model": model,
        "precision": precision,
        "images": images,
        "runs": runs,
        "workers": workers,
        "ray": ray.__version__,
        "cluster_start_s": round(cluster_s, 1),
        "captions_identical": identical,
    }
    for arm, values in rates.items():
        summary[f"{arm}_images_per_s"] = {
            "median": round(statistics.median(values), 1),
            "min": round(min(values), 1),
            "max": round(max(values), 1),
        }
    summary["ray_over_direct"] = round(
        summary["ray_images_per_s"]["median"] / summary["direct_images_per_s"]["median"], 3
    )
    text = json.dumps(summary, indent=2)
    print(text)
    if json_out:
        json_out.write_text(text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.ray_collection ARGV``: the exit status."""
    return run_program(cli, argv)


if __name__ == "__main__":
    raise SystemExit(main())
