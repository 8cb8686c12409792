"""A speed-up measured as a series of ``edgecap bench`` reports, not one: median, worst run, runs below a target.

On a shared machine one report's ONNX-Runtime-vs-torch ratio moves by ±15 % between runs, so a target such as "ORT
FP32 beam-3 decoding at least 3× faster than torch eager at batch 1" is judged here on N back-to-back reports of the
same bundle. Each run is a separate ``edgecap bench`` process (the report and the per-combination subprocesses are
exactly what a user gets); the reports are kept under ``--out`` and the summary is written next to them.

Usage::

    python benchmarks/ratio_series.py --runs 10 --target 3 --out /tmp/series -- \\
        --bundle ~/.edgecap/bundles/acort-xsmall --runtime torch,onnxruntime --precision fp32 --batch 1 --beam 3 \\
        --threads 1 --no-quality
    python benchmarks/ratio_series.py --target 3 --reports /tmp/series/run-*   # summarise existing reports
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from edgecap._io import atomic_write_json, atomic_write_text
from edgecap.bench.ratios import ratio_series, series_lines
from edgecap.bench.report import load_report

BENCH = [sys.executable, "-c", "from edgecap.cli import main; main()", "bench"]


def run_series(runs: int, out: Path, bench_args: list[str]) -> list[Path]:
    """Run ``edgecap bench BENCH_ARGS`` ``runs`` times back to back, each into ``out/run-NN``."""
    if any(a == "--out" or a.startswith("--out=") for a in bench_args):
        raise SystemExit("give --out to this script, not to edgecap bench: each run gets its own directory")
    dirs = []
    for i in range(runs):
        run_dir = out / f"run-{i + 1:02d}"
        subprocess.run([*BENCH, *bench_args, "--out", str(run_dir), "--quiet", "--no-plots"], check=True)
        dirs.append(run_dir)
        print(f"run {i + 1}/{runs}: {run_dir}  (load {os.getloadavg()[0]:.2f})", flush=True)
    return dirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="reports to measure (ignored with --reports)")
    parser.add_argument(
        "--target",
        type=float,
        help="count the runs below this speed-up (decoder loop; end to end for pixels-in vs torch backbone)",
    )
    parser.add_argument("--out", type=Path, help="directory for the reports and series.md / series.json")
    parser.add_argument("--reports", type=Path, nargs="+", help="summarise these report directories/files instead")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: the edgecap bench options")
    args = parser.parse_args()
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    if args.reports:
        paths = args.reports
    else:
        if args.out is None or not bench_args:
            parser.error("measuring needs --out and the edgecap bench options after --")
        if args.runs < 1:
            parser.error("--runs must be >= 1")
        paths = run_series(args.runs, args.out, bench_args)
    reports = [load_report(p) for p in paths]
    series = ratio_series((r.results, r.bundles) for r in reports)
    if not series:
        raise SystemExit("no comparison found in these reports (each needs both runtimes of a comparison)")
    lines = [
        f"Speed-ups over {len(paths)} report(s): median (min–max).",
        "",
        *series_lines(series, args.target),
    ]
    print("\n".join(lines))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out / "series.md", "\n".join(lines) + "\n")
        atomic_write_json(
            args.out / "series.json",
            {
                "reports": [str(p) for p in paths],
                "target": args.target,
                "series": [dataclasses.asdict(s) for s in series],
            },
        )


if __name__ == "__main__":
    main()
