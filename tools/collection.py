"""Benchmark of ``edgecap caption DIR --out X.jsonl`` on a synthetic collection (``docs/collections.md``).

    python -m tools.collection --images 100000 --ratio-images 4000 --runs 5 --model acort-xsmall

It generates small random PNGs into a temporary folder (removed afterwards) and runs the real command in
subprocesses, measuring:

- throughput: ``--workers 2`` over two folders against two independent ``--workers 1`` processes, one per folder,
  started together, with the same thread budget (``--threads 2`` split by the pool vs ``--threads 1`` each), the
  independent ones once free and once pinned to a CPU each (as the pool pins its workers); ``--runs`` interleaved
  rounds of ``--ratio-images`` images per arm, each timed from start to exit (model loads included);
- peak RSS (psutil: the command and its workers together, sampled every 0.1 s) at ``--images`` / 10 and at
  ``--images``: flat in the count when the listing streams;
- a kill at half of ``--images`` lines (SIGKILL to the command), then ``--resume``: every image exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np
import psutil
from PIL import Image

from tools import run_program

__all__ = ["check_once", "generate_images", "main"]

_PER_FOLDER = 1000


def generate_images(root: Path, count: int, seed: int = 0, size: int = 32) -> None:
    """``count`` random ``size`` x ``size`` PNGs in folders of :data:`_PER_FOLDER`."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        folder = root / f"{i // _PER_FOLDER:04d}"
        if i % _PER_FOLDER == 0:
            folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i:07d}.png")


def _command(sources: list[Path], out: Path, args: SimpleNamespace, *extra: str) -> list[str]:
    words = [sys.executable, "-m", "edgecap", "caption", *map(str, sources), "--recursive", "--out", str(out)]
    return [*words, "--model", args.model, "--precision", args.precision, *extra]


def _tree_rss(process: psutil.Process) -> int:
    total = 0
    with contextlib.suppress(psutil.Error):
        for p in [process, *process.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # a worker that exited meanwhile
                total += p.memory_info().rss
    return total


def _run(
    commands: list[list[str]], kill_at: tuple[Path, int] | None = None, pin: bool = False
) -> tuple[float, int, bool]:
    """Start ``commands`` together and wait for all: (wall seconds, peak RSS of all their process trees, killed).
    ``kill_at``: SIGKILL the (single) command once that file has that many lines. ``pin``: command i runs on CPU i
    (and its worker with it), as ``--workers`` pins its workers."""
    start = time.perf_counter()
    runs = []
    for i, command in enumerate(commands):
        cpus = {sorted(os.sched_getaffinity(0))[i]} if pin else None
        runs.append(subprocess.Popen(command, stderr=subprocess.DEVNULL, preexec_fn=_pinner(cpus)))
    watched = [psutil.Process(r.pid) for r in runs]
    peak, killed = 0, False
    while any(r.poll() is None for r in runs):
        peak = max(peak, sum(_tree_rss(p) for p in watched))
        if kill_at is not None and not killed and _count_lines(kill_at[0]) >= kill_at[1]:
            os.kill(runs[0].pid, signal.SIGKILL)
            killed = True
        time.sleep(0.1)
    seconds = time.perf_counter() - start
    if not killed and any(r.returncode != 0 for r in runs):
        raise RuntimeError(f"a run failed: {[r.returncode for r in runs]} for {commands}")
    return seconds, peak, killed


def _pinner(cpus: set[int] | None) -> Any:
    return None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))


def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def check_once(out: Path, expected: int) -> dict[str, int]:
    """Lines, distinct paths and errors of a JSONL output that should hold each of ``expected`` images once."""
    paths: set[str] = set()
    lines = errors = 0
    with open(out, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            paths.add(record["path"])
            lines += 1
            errors += "error" in record
    return {"lines": lines, "distinct_paths": len(paths), "expected": expected, "errors": errors}


def _throughput(root: Path, args: SimpleNamespace, work: Path) -> dict[str, Any]:
    half = args.ratio_images // 2
    a, b = root / "a", root / "b"
    generate_images(a, half, seed=1)
    generate_images(b, half, seed=2)
    rates: dict[str, list[float]] = {"pooled": [], "separate": [], "separate_pinned": []}
    arms = list(rates)
    for run in range(args.runs):
        for which in arms[run % len(arms) :] + arms[: run % len(arms)]:  # each arm goes first in turn
            for stale in work.glob("ratio-*.jsonl"):
                stale.unlink()
            if which == "pooled":
                pool = _command([a, b], work / "ratio-p.jsonl", args, "--workers", "2", "--threads", "2")
                seconds, _, _ = _run([pool])
            else:
                commands = [_command([d], work / f"ratio-{d.name}.jsonl", args, "--threads", "1") for d in (a, b)]
                seconds, _, _ = _run(commands, pin=which == "separate_pinned")
            rates[which].append(2 * half / seconds)
            print(f"run {run + 1} {which}: {2 * half / seconds:.1f} images/s", file=sys.stderr)
    out: dict[str, Any] = {"images_per_run": 2 * half, **{f"{k}_images_s": v for k, v in rates.items()}}
    for baseline in ("separate", "separate_pinned"):
        ratios = [p / s for p, s in zip(rates["pooled"], rates[baseline], strict=True)]
        out[f"ratio_vs_{baseline}"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    out["load_average"] = os.getloadavg()
    return out


def _large(root: Path, args: SimpleNamespace, work: Path) -> dict[str, Any]:
    """Peak RSS at a tenth of ``--images`` and at ``--images``; the large run is killed at half and resumed."""
    results: dict[str, Any] = {}
    small, large = root / "small", root / "large"
    generate_images(small, args.images // 10, seed=3)
    seconds, peak_small, _ = _run([_command([small], work / "small.jsonl", args, "--workers", "2")])
    results["rss_small"] = {"images": args.images // 10, "peak_rss_mib": peak_small / 2**20, "seconds": seconds}
    print(json.dumps(results["rss_small"]), file=sys.stderr)
    generate_images(large, args.images, seed=4)
    out = work / "large.jsonl"
    first, peak_first, killed = _run([_command([large], out, args, "--workers", "2")], kill_at=(out, args.images // 2))
    at_kill = _count_lines(out)
    second, peak_second, _ = _run([_command([large], out, args, "--workers", "2", "--resume")])
    results["rss_large"] = {
        "images": args.images,
        "peak_rss_mib": max(peak_first, peak_second) / 2**20,
        "seconds": first + second,
        "images_s": args.images / (first + second),
    }
    results["kill_resume"] = {"killed": killed, "lines_at_kill": at_kill, **check_once(out, args.images)}
    return results


def _bundle(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    from edgecap.runtime.bundle.layout import find_bundle

    if find_bundle(value) is None:
        raise click.BadParameter(f"no bundle {value!r}: `edgecap quickstart` exports acort-xsmall, or pass a bundle")
    return value


def _parts(_ctx: click.Context, _param: click.Parameter, value: str) -> set[str]:
    parts = set(value.split(","))
    if not parts <= {"throughput", "large"}:
        raise click.BadParameter(f"{value!r}: a comma-separated list of throughput, large")
    return parts


@click.command(help=__doc__.split("\n")[0])
@click.option(
    "--images",
    type=click.IntRange(min=10),
    default=100_000,
    show_default=True,
    help="The large collection (RSS, kill + resume).",
)
@click.option(
    "--ratio-images", type=click.IntRange(min=2), default=4000, show_default=True, help="Images per throughput run."
)
@click.option("--runs", type=click.IntRange(min=1), default=5, show_default=True, help="Interleaved throughput pairs.")
@click.option(
    "--model", default="acort-xsmall", show_default=True, callback=_bundle, help="A pixels-in bundle or its name."
)
@click.option("--precision", default="int8", show_default=True)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the temporary images go [default: /tmp].",
)
@click.option(
    "--parts",
    default="throughput,large",
    show_default=True,
    callback=_parts,
    help="What to measure: throughput, large (RSS, kill).",
)
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Also write the results here.")
def cli(**options: Any) -> int:
    args = SimpleNamespace(**options)
    results: dict[str, Any] = {
        "command": " ".join(["python -m tools.collection", *sys.argv[1:]]),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}",
    }
    with tempfile.TemporaryDirectory(prefix="edgecap-collection-bench-", dir=args.workdir) as tmp:
        root, work = Path(tmp) / "images", Path(tmp) / "out"
        work.mkdir()
        if "throughput" in args.parts:
            results["throughput"] = _throughput(root / "ratio", args, work)
            print(json.dumps(results["throughput"]), file=sys.stderr)
        if "large" in args.parts:
            results |= _large(root, args, work)

    text = json.dumps(results, indent=2)
    print(text)
    if args.json_out is not None:
        args.json_out.write_text(text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.collection ARGV``: the exit status."""
    return run_program(cli, argv)


if __name__ == "__main__":
    sys.exit(main())
