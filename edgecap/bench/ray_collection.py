"""Benchmark of the Ray Data path (``edgecap caption DIR --ray``) against a direct ``Captioner`` loop (``docs/ray.md``).

    python -m edgecap.bench.ray_collection --images 2000 --runs 5 --model acort-xsmall

It generates small random PNGs into a temporary folder (removed afterwards), starts one local Ray cluster of this
machine's CPUs, and times ``--runs`` interleaved rounds of two arms, each from start to the last line written (model
loads included, the cluster's start not: it is reported on its own):

- ``direct``: one process, ``Captioner.load(threads=<all CPUs>)``, ``batch`` over every path, JSONL lines written;
- ``ray``: :func:`~edgecap.runtime.collections.ray_job.caption_with_ray` with ``--workers`` actors (``threads``
  ``auto``: each actor one equal share of the CPUs) into a JSONL file.

Every round checks that the Ray file has exactly the direct loop's captions, path for path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

__all__ = ["main"]


def _images(root: Path, count: int, size: int = 32) -> list[str]:
    """``count`` random ``size`` x ``size`` PNGs in folders of 500, in listing order."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        folder = root / f"{i // 500:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i:06d}.png")
        paths.append(str(folder / f"{i:06d}.png"))
    return paths


def _direct(paths: list[str], out: Path, args: argparse.Namespace, cpus: int) -> dict[str, str]:
    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.collections.journal import record_line

    with Captioner.load(args.model, precision=args.precision, threads=cpus) as cap:
        captions = cap.batch(paths, batch_size=16)
    out.write_bytes(b"".join(record_line(p, c) for p, c in zip(paths, captions, strict=True)))
    return {p: c for p, c in zip(paths, captions, strict=True) if c is not None}


def _ray(root: Path, out: Path, args: argparse.Namespace) -> dict[str, str]:
    from edgecap.runtime.collections.ray_job import caption_with_ray

    caption_with_ray(
        [root], out, bundle=Path(args.model), address=None, recursive=True, resume=False, workers=args.workers,
        runtime="auto", precision=args.precision, threads="auto", beam=None, length_level=None,
    )  # fmt: skip
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return {r["path"]: r["caption"] for r in records if "caption" in r}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2, help="Ray actors (default 2)")
    parser.add_argument("--model", default="acort-xsmall", help="bundle path or exported model name")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    import ray

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    rates: dict[str, list[float]] = {"direct": [], "ray": []}
    identical = True
    with tempfile.TemporaryDirectory(prefix="edgecap-ray-bench-") as tmp:
        root = Path(tmp) / "images"
        paths = _images(root, args.images)
        started = time.perf_counter()
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        cluster_s = time.perf_counter() - started
        try:
            for run in range(args.runs):
                results = {}
                for arm in ("direct", "ray") if run % 2 == 0 else ("ray", "direct"):  # interleaved, order alternating
                    out = Path(tmp) / f"{arm}-{run}.jsonl"
                    begin = time.perf_counter()
                    results[arm] = _direct(paths, out, args, cpus) if arm == "direct" else _ray(root, out, args)
                    rates[arm].append(args.images / (time.perf_counter() - begin))
                identical = identical and results["direct"] == results["ray"] and len(results["ray"]) == args.images
        finally:
            ray.shutdown()
    summary: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {cpus} CPUs ({platform.processor() or platform.platform()})",
        "model": args.model,
        "precision": args.precision,
        "images": args.images,
        "runs": args.runs,
        "workers": args.workers,
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
    if args.json:
        args.json.write_text(text + "\n")
    return summary


if __name__ == "__main__":
    main()
