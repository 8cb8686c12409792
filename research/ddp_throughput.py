"""Cross-entropy training throughput (images/s) of 1 versus N data-parallel processes under torchrun.

Every configuration is ``python -m torch.distributed.run --standalone --nproc-per-node P -m edgecap train ...`` on
the same data at the same **global** batch (``--batch-size G/P`` per process; docs/training.md, "Global batch and
learning rate"), stopped by ``--max-steps``. Throughput is read from rank 0's ``metrics.jsonl``: the logged
``elapsed_s`` of consecutive ``train`` lines *within one epoch* (steps 1, 20, 40, ... and an epoch's last batch), so
process start-up, the first step, validation and the end-of-epoch checkpoint are all left out.

- **CPU** (gloo): P processes share the machine's cores evenly: ``OMP_NUM_THREADS`` and ``--threads`` = cores / P.
- **CUDA**: one process per GPU (NCCL, rank i on ``cuda:i``). On a machine with one GPU a second process has no GPU
  of its own (NCCL refuses two ranks on one device), so ``--device cuda`` measures one process on the GPU and the
  process scaling with gloo on the CPU, and the report says so.

Data: ``--data``/``--features`` (e.g. the quickstart's set and feature cache), else a synthetic dataset (the
quickstart's generator, seed 0) with random 7×7×1280 grid features (EfficientNet-Lite0's shape; throughput does not
depend on their values), built once under ``OUT/work``. Writes ``OUT/ddp_throughput.json`` after every run and
``OUT/ddp_throughput.md``. Usage (repository root)::

    PYTHONPATH=$PWD python3 research/ddp_throughput.py --device cuda --procs 1 --procs 2 --out OUT
    python -m research.ddp_throughput --smoke --out /tmp/ddp-smoke      # tiny CPU run
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from tools.stages import Results, child_env, md_table, read_jsonl, run_stage

GRID, FEATURE_DIM, IMAGE_SIDE = 7, 1280, 256
ONE_GPU_NOTE = (
    "one CUDA device: P > 1 processes cannot train on it with NCCL (each rank needs its own GPU; NCCL refuses two "
    "ranks on one device), so CUDA is measured with 1 process and the process scaling with gloo on the CPU"
)


def check_args(args: SimpleNamespace) -> SimpleNamespace:
    """The options the click types cannot check on their own."""
    if args.smoke:
        args.device, args.images, args.steps, args.batch, args.run_limit = "cpu", 80, 20, 8, 120.0
    bad = [n for n in args.procs if n < 1 or args.batch % n]
    if bad:
        raise click.UsageError(f"--batch {args.batch} must split evenly over every --procs value (not {bad})")
    if (args.data is None) != (args.features is None):
        raise click.UsageError("give --data and --features together (or neither, for the synthetic set)")
    return args


def plan(args: SimpleNamespace, cuda_devices: int) -> list[dict[str, Any]]:
    """The runs: (device, processes, threads per process, per-process batch), and any skipped with the reason."""
    runs: list[dict[str, Any]] = []
    if args.device == "cuda":
        for n in args.procs:
            if n <= cuda_devices:
                runs.append({"device": "cuda", "procs": n, "threads": max(1, args.cores // n)})
            else:
                runs.append({"device": "cuda", "procs": n, "skipped": f"{cuda_devices} CUDA device(s): {ONE_GPU_NOTE}"})
    if args.device == "cpu" or any("skipped" in r for r in runs):
        for n in args.procs:
            if n > args.cores:
                runs.append({"device": "cpu", "procs": n, "skipped": f"only {args.cores} cores"})
            else:
                runs.append({"device": "cpu", "procs": n, "threads": max(1, args.cores // n)})
    for r in runs:
        r["batch_per_proc"] = args.batch // r["procs"]
    return runs


def build_data(work: Path, images: int) -> tuple[Path, Path]:
    """A synthetic dataset (90 % train, so an epoch covers many steps) and random grid features, once."""
    import numpy as np

    from edgecap.workshop.data.synthetic import generate_dataset

    data, feats = work / f"synthetic-{images}", work / f"grid-features-{images}"
    if not (data / "dataset.json").is_file():
        generate_dataset(data, images, seed=0, splits=(0.9, 0.05, 0.05), overwrite=True, progress=False)
    done = feats / ".complete"
    if not done.is_file():
        feats.mkdir(parents=True, exist_ok=True)
        cell = IMAGE_SIDE / GRID
        xy = np.stack(np.meshgrid(np.arange(GRID), np.arange(GRID), indexing="xy"), -1).reshape(-1, 2) * cell
        boxes = np.concatenate([xy, xy + cell], axis=1).astype(np.float32)
        rng = np.random.default_rng(0)
        for image in json.loads((data / "dataset.json").read_text())["images"]:
            feat = rng.standard_normal((GRID * GRID, FEATURE_DIM), dtype=np.float32).astype(np.float16)
            np.savez(feats / f"{image['cocoid']}.npz", feat=feat, bbox=boxes, image_w=IMAGE_SIDE, image_h=IMAGE_SIDE)
        done.write_text("ok\n")
    return data, feats


def throughput(metrics: list[dict[str, Any]], global_batch: int) -> dict[str, Any]:
    """Images/s over consecutive ``train`` lines of the same epoch (no start-up, validation or epoch checkpoint)."""
    lines = [r for r in metrics if r.get("event") == "train"]
    steps = seconds = 0.0
    for a, b in zip(lines, lines[1:], strict=False):
        if a["epoch"] == b["epoch"] and b["step"] > a["step"] and b["elapsed_s"] > a["elapsed_s"]:
            steps += b["step"] - a["step"]
            seconds += b["elapsed_s"] - a["elapsed_s"]
    if not steps:
        return {"images_per_s": None, "measured_steps": 0, "note": "fewer than two logged steps in one epoch"}
    return {
        "images_per_s": round(steps * global_batch / seconds, 1),
        "measured_steps": int(steps),
        "measured_s": round(seconds, 2),
        "ms_per_step": round(1000 * seconds / steps, 1),
    }


def torchrun_cmd(args: SimpleNamespace, run: dict[str, Any], data: Path, feats: Path, out: Path) -> list[Any]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", run["procs"],
            "-m", "edgecap", "train", "--model", args.model, "--data", data, "--features", feats, "--out", out,
            "--epochs", 1000, "--max-steps", args.steps, "--batch-size", run["batch_per_proc"],
            "--device", run["device"], "--threads", run["threads"], "--seed", 0, "--no-resume"]  # fmt: skip


def execute(args: SimpleNamespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    cuda_devices = 0
    meta: dict[str, Any] = {"model": args.model, "device": args.device, "global_batch": args.batch,
                            "steps": args.steps, "cores": args.cores, "smoke": args.smoke,
                            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    if args.device == "cuda":
        import torch

        cuda_devices = torch.cuda.device_count()
        meta.update(torch=torch.__version__, cuda_devices=cuda_devices,
                    gpu=torch.cuda.get_device_name(0) if cuda_devices else None)  # fmt: skip
    results = Results(args.out / "ddp_throughput.json", meta)
    runs = plan(args, cuda_devices)
    if any("skipped" in r and r["device"] == "cuda" for r in runs):
        results.set(note=ONE_GPU_NOTE)
    t0 = time.monotonic()
    if args.data is None:
        data, feats = build_data(args.out / "work", args.images)
    else:
        data, feats = args.data, args.features
    results.stage({"stage": "data", "status": "ok", "wall_s": round(time.monotonic() - t0, 1), "data": str(data)})
    for run in runs:
        row = {"model": args.model, **run, "global_batch": args.batch}
        if "skipped" in run:
            results.row(row)
            continue
        name = f"{run['device']}-p{run['procs']}"
        run_dir = args.out / "work" / "runs" / name
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh metrics.jsonl: throughput reads every line of it
        env = child_env({"OMP_NUM_THREADS": str(run["threads"])})
        limit = min(args.run_limit, results.left(args.budget))
        record = run_stage(name, torchrun_cmd(args, run, data, feats, run_dir), limit, args.out / "logs", env)
        results.stage(record)
        row.update(status=record["status"], wall_s=record["wall_s"])
        row.update(throughput(read_jsonl(run_dir / "metrics.jsonl"), args.batch))
        results.row(row)
    _scaling(results.data["rows"])
    return _finish(args.out, results)


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--procs", type=int, multiple=True, default=[1, 2], show_default=True)
@click.option("--steps", type=int, default=100, help="Optimiser steps per run (--max-steps).", show_default=True)
@click.option(
    "--batch", type=int, default=32, help="Global batch in images (split evenly over processes).", show_default=True
)
@click.option("--model", default="acort-xsmall", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True)
@click.option("--data", type=click.Path(path_type=Path), help="Dataset directory [default: a synthetic one].")
@click.option("--features", type=click.Path(path_type=Path), help="Feature cache / region features for --data.")
@click.option("--images", type=int, default=1200, help="Synthetic scenes when --data is not given.", show_default=True)
@click.option("--cores", type=int, default=len(os.sched_getaffinity(0)), help="CPU cores to split.", show_default=True)
@click.option("--run-limit", type=float, default=150.0, help="Seconds one torchrun job may take.", show_default=True)
@click.option("--budget", type=float, default=420.0, help="Wall-clock seconds for everything.", show_default=True)
@click.option("--smoke", is_flag=True, help="Tiny CPU run: 80 images, 20 steps, global batch 8.")
def main(**options: Any) -> None:
    # repeatable options come as tuples: a list, or None when not given (execute sets the defaults)
    args = SimpleNamespace(**{k: list(v) or None if isinstance(v, tuple) else v for k, v in options.items()})
    sys.exit(execute(check_args(args)))


def _scaling(rows: list[dict[str, Any]]) -> None:
    """Each row's speed-up over the 1-process row of its device."""
    base = {r["device"]: r.get("images_per_s") for r in rows if r["procs"] == 1}
    for r in rows:
        if r.get("images_per_s") and base.get(r["device"]):
            r["speedup_vs_1"] = round(r["images_per_s"] / base[r["device"]], 2)


def _finish(out: Path, results: Results) -> int:
    from tools.files import write_text

    results.set(total_s=round(time.monotonic() - results.started, 1))
    meta = results.data["meta"]
    text = f"# Data-parallel training throughput: {meta['model']}\n\n"
    text += f"Global batch {meta['global_batch']} images, {meta['steps']} steps per run, {meta['cores']} CPU cores "
    text += "split evenly over the processes (gloo on CPU). Images/s from rank 0's logged steps within an epoch "
    text += "(start-up, first step, validation and checkpoints excluded).\n"
    if meta.get("note"):
        text += f"\n{meta['note']}.\n"
    keys = ["model", "device", "procs", "threads", "batch_per_proc", "images_per_s", "speedup_vs_1", "ms_per_step",
            "measured_steps", "wall_s", "status", "skipped"]  # fmt: skip
    text += "\n" + md_table(results.data["rows"], keys)
    text += f"\n_total {meta['total_s']} s_\n"
    write_text(out / "ddp_throughput.md", text)
    print(text, flush=True)
    results.flush()
    ok = all(r.get("status") == "ok" for r in results.data["rows"] if "skipped" not in r)
    return 0 if ok else 1


if __name__ == "__main__":
    main()
