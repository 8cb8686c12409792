"""``benchmarks/ddp_throughput.py``: the plan (one GPU: the process scaling moves to gloo on the CPU), images/s from
logged step times, and a real two-process gloo run under torchrun at a tiny size."""

from __future__ import annotations

import json
from pathlib import Path

from tests.scripts import load_script


def _load_script():  # type: ignore[no-untyped-def]
    return load_script("ddp_throughput")


def test_one_gpu_measures_one_cuda_process_and_scales_on_the_cpu(tmp_path: Path) -> None:
    script = _load_script()
    args = script.parse_args(["--device", "cuda", "--procs", "1", "2", "--cores", "16", "--out", str(tmp_path)])
    runs = script.plan(args, cuda_devices=1)
    measured = [(r["device"], r["procs"], r["threads"], r["batch_per_proc"]) for r in runs if "skipped" not in r]
    assert measured == [("cuda", 1, 16, 32), ("cpu", 1, 16, 32), ("cpu", 2, 8, 16)]
    skipped = [r for r in runs if "skipped" in r]
    assert [(r["device"], r["procs"]) for r in skipped] == [("cuda", 2)] and "NCCL" in skipped[0]["skipped"]
    assert [r["device"] for r in script.plan(args, cuda_devices=2)] == ["cuda", "cuda"]


def test_throughput_counts_only_steps_within_an_epoch() -> None:
    script = _load_script()
    lines = [
        {"event": "train", "epoch": 0, "step": 1, "elapsed_s": 5.0},
        {"event": "train", "epoch": 0, "step": 20, "elapsed_s": 6.9},
        {"event": "val", "epoch": 0, "step": 25, "elapsed_s": 30.0},
        {"event": "train", "epoch": 0, "step": 25, "elapsed_s": 7.4},
        {"event": "train", "epoch": 1, "step": 40, "elapsed_s": 40.0},  # after validation: not counted
        {"event": "train", "epoch": 1, "step": 60, "elapsed_s": 42.0},
    ]
    result = script.throughput(lines, global_batch=32)
    assert result["measured_steps"] == 44 and abs(result["measured_s"] - 4.4) < 1e-9
    assert result["images_per_s"] == round(44 * 32 / 4.4, 1)
    assert script.throughput(lines[:1], 32)["images_per_s"] is None


def test_two_gloo_processes_train_and_report_images_per_second(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _load_script().main(["--smoke", "--procs", "2", "--cores", "2", "--out", str(out)]) == 0
    report = json.loads((out / "ddp_throughput.json").read_text())
    (row,) = report["rows"]
    assert row["procs"] == 2 and row["batch_per_proc"] == 4 and row["threads"] == 1
    assert row["images_per_s"] > 0 and row["measured_steps"] == 8
    assert "| cpu | 2 | 1 | 4 |" in (out / "ddp_throughput.md").read_text()
