"""The one GPU check: CUDA tests, torch-CUDA parity and precision, throughput by step mode, ONNX Runtime's
GPU providers and the TensorRT runtime where installed, and LaBERT mask-predict against length-aware autoregressive
decoding per length level. Everything a GPU run of ``docs/gpu.md`` reports comes from here.

Run on one CUDA GPU, from the repository root, as the pytest job ``tests/gpu/test_gpu_check.py``::

    EDGECAP_GPU_CHECK_RUN=.gpu-run/acort-xsmall EDGECAP_GPU_CHECK_OUT="$OUT" \
        python -m pytest -m gpu_check tests/gpu/test_gpu_check.py

or directly as ``python -m tools.gpu_check --run .gpu-run/acort-xsmall --out "$OUT"`` (``--device cpu``:
a smoke test of the orchestration without a GPU).

``--run`` is a trained run directory (``config.json``, ``vocab.json``, ``weights.safetensors``); its test images come
from ``--data`` (default: a ``synthetic`` dataset next to the run, else a small regeneration with the quickstart's
generator and seed). Without ``--run`` a random-weights acort-xsmall is used and the agreement and CIDEr-D numbers say
they are not meaningful.

Every section runs in its own process under its own time budget (the whole check fits ``--budget`` seconds, 270 by
default), and writes ``OUT/<section>.json`` after each measurement, so a timeout still leaves what was measured.
``OUT/summary.md`` is appended after each section; ``OUT/env.json`` records the machine.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from tools import run_program
from tools.files import write_json
from tools.gpu_runtimes import section_compile, section_labert, section_onnxruntime
from tools.gpu_sections import section_parity, section_sweep, section_tests, section_transfer
from tools.gpu_setup import Recorder
from tools.stages import install_carried_wheels

#: The repository root (the folder above ``tools/``): sections run there, and ``.whl/`` is looked for there.
ROOT = Path(__file__).resolve().parents[1]

#: (section, seconds): the order sections run in and each one's wall-clock budget (process start included).
SECTIONS: tuple[tuple[str, int], ...] = (
    ("tests", 45),
    ("parity", 45),
    ("sweep", 70),
    ("transfer", 15),
    ("onnxruntime", 15),
    ("labert", 35),
    ("compile", 30),
)
SECTION_FNS: dict[str, Callable[[SimpleNamespace, Recorder], None]] = {
    "tests": section_tests,
    "parity": section_parity,
    "sweep": section_sweep,
    "transfer": section_transfer,
    "onnxruntime": section_onnxruntime,
    "labert": section_labert,
    "compile": section_compile,
}
SWEEP_BATCHES = (1, 8, 64, 256, 1024)  # 1024: where the best path may reach its throughput


# -- the orchestrating process ----------------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    """GPU name, driver, versions and providers (printed and written to ``env.json``)."""
    env: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    if shutil.which("nvidia-smi"):
        query = "name,driver_version,memory.total,compute_cap"
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
        env["nvidia_smi"] = out.stdout.strip() or out.stderr.strip()
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        env["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    except ImportError as exc:
        env["torch"] = f"not importable: {exc}"
    try:
        import numpy

        env["numpy"] = numpy.__version__
    except ImportError:
        env["numpy"] = None
    try:
        import onnxruntime

        env["onnxruntime"] = onnxruntime.__version__
        env["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except ImportError as exc:
        env["onnxruntime"] = f"not importable: {exc}"
    try:
        import tensorrt

        env["tensorrt"] = tensorrt.__version__
    except ImportError:
        env["tensorrt"] = None
    from edgecap.runtime.backends.registry import list_runtimes

    env["runtimes"] = list_runtimes()
    env["runtimes_available"] = list_runtimes(available=True)
    return env


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A section's rows as one table: every scalar key, in first-seen order (log tails and nested values left out)."""
    rows = [r for r in rows if "tail" not in r]
    if not rows:
        return "(no rows)\n"
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys and not isinstance(r[k], dict)]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
    return "\n".join(lines) + "\n"


def _summarise(out: Path, section: str, status: str) -> None:
    path = out / f"{section}.json"
    data = json.loads(path.read_text()) if path.is_file() else {"rows": []}
    head = {k: v for k, v in data.items() if k not in ("rows", "section")}
    text = f"\n## {section} — {status}\n\n"
    if head:
        text += "".join(f"- {k}: {v}\n" for k, v in head.items()) + "\n"
    text += markdown_table(data.get("rows", []))
    for r in data.get("rows", []):
        if "tail" in r:
            text += "\n```\n" + "\n".join(r["tail"]) + "\n```\n"
    with (out / "summary.md").open("a") as fh:
        fh.write(text)


def orchestrate(args: SimpleNamespace) -> int:
    """Write ``env.json``, run each chosen section in its own process within the budget, and append each one's
    tables to ``summary.md``; 0 when every section finished, else 1."""
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        carried = install_carried_wheels(Path(tempfile.gettempdir()) / "edgecap-gpu-check" / "site", ROOT)
        site = None if carried is None else str(carried)
    except (subprocess.SubprocessError, OSError) as exc:
        site = f"failed: {exc}"
    env = environment()
    env["carried_wheels"] = site
    write_json(args.out / "env.json", env)
    for key in (
        "nvidia_smi",
        "gpu",
        "capability",
        "torch",
        "torch_cuda",
        "numpy",
        "onnxruntime",
        "onnxruntime_providers",
        "tensorrt",
        "runtimes_available",
    ):
        print(f"{key}: {env.get(key)}", flush=True)
    header = f"# edgecap GPU check\n\n- started {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime())}\n"
    header += "".join(f"- {k}: {v}\n" for k, v in env.items())
    if not args.run:
        header += "- **no --run: random-weights acort-xsmall; agreement and CIDEr-D numbers are not meaningful**\n"
    (args.out / "summary.md").write_text(header)
    if not env.get("cuda_available") and args.device != "cpu":
        print("no CUDA device; nothing to check (--device cpu runs the CPU smoke test)", flush=True)
        return 1
    chosen = [s for s in SECTIONS if args.only is None or s[0] in args.only]
    status_all = 0
    for i, (section, budget) in enumerate(chosen):
        left = args.budget - (time.perf_counter() - start)
        later_min = sum(min(10, b) for _, b in chosen[i + 1 :])
        allowed = int(min(budget, left - later_min - 2))
        if allowed < 8:
            _summarise(args.out, section, f"skipped: {int(left)} s left of the {args.budget} s budget")
            continue
        cmd = [sys.executable, "-m", "tools.gpu_check", "--section", section, "--section-budget", str(allowed)]
        cmd += ["--out", str(args.out), "--images", str(args.images), "--repeats", str(args.repeats)]
        cmd += ["--labert-models", ",".join(args.labert_models), "--ar-models", ",".join(args.ar_models)]
        cmd += ["--device", args.device, "--batches", ",".join(map(str, args.batches))]
        if args.run:
            cmd += ["--run", args.run]
        if args.data:
            cmd += ["--data", args.data]
        t0 = time.perf_counter()
        print(f"== {section} (budget {allowed} s)", flush=True)
        with (args.out / f"{section}.log").open("w") as log:
            try:
                proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=allowed)
                status = "ok" if proc.returncode == 0 else f"exit {proc.returncode} (see {section}.log)"
            except subprocess.TimeoutExpired:
                status = f"timed out after {allowed} s (partial results)"
        if status != "ok":
            status_all = 1
        status += f", {time.perf_counter() - t0:.1f} s"
        print(f"   {status}", flush=True)
        _summarise(args.out, section, status)
    total = time.perf_counter() - start
    with (args.out / "summary.md").open("a") as fh:
        fh.write(f"\n_total {total:.1f} s_\n")
    print((args.out / "summary.md").read_text(), flush=True)
    return status_all


def _names(choices: Sequence[str] | None = None) -> Any:
    """A click callback: a comma-separated list, each name one of ``choices`` when given."""

    def split(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        names = tuple(v for v in value.split(",") if v)
        unknown = [n for n in names if choices is not None and n not in choices]
        if not names or unknown:
            raise click.BadParameter(f"{value!r}: a comma-separated list of {', '.join(choices or ['names'])}")
        return names

    return split


def _batches(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        batches = tuple(int(v) for v in value.split(","))
    except ValueError:
        batches = ()
    if not batches or min(batches) < 1:
        raise click.BadParameter(f"{value!r}: comma-separated batch sizes >= 1")
    return batches


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--run", help="Trained run directory [default: random-weights acort-xsmall].")
@click.option("--data", help="Dataset directory with a test split [default: next to the run, else regenerated].")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for the JSON files and summary.md.",
)
@click.option(
    "--budget",
    type=click.IntRange(min=1),
    default=270,
    show_default=True,
    help="Wall-clock seconds for the whole check.",
)
@click.option(
    "--images",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Test images for agreement and CIDEr-D.",
)
@click.option(
    "--repeats", type=click.IntRange(min=5), default=7, show_default=True, help="Timed repeats per configuration."
)
@click.option("--only", callback=_names([s for s, _ in SECTIONS]), help="Run only these sections (comma-separated).")
@click.option("--labert-models", default="labert-xsmall,labert-base", show_default=True, callback=_names())
@click.option("--ar-models", default="acort-xsmall-len,expansionnet-v2-len", show_default=True, callback=_names())
@click.option(
    "--batches",
    default=",".join(map(str, SWEEP_BATCHES)),
    show_default=True,
    callback=_batches,
    help="Sweep batch sizes (comma-separated).",
)
@click.option(
    "--device",
    type=click.Choice(["cuda", "cpu"]),
    default="cuda",
    show_default=True,
    help="cpu: a smoke test of the script.",
)
@click.option("--section", type=click.Choice(list(SECTION_FNS)), hidden=True)
@click.option("--section-budget", type=int, default=60, hidden=True)
def cli(**options: Any) -> int:
    """The orchestrator, or (``--section``) one section in this process; the exit status."""
    args = SimpleNamespace(**options)
    if args.section is None:
        return orchestrate(args)
    rec = Recorder(args.out, args.section)
    try:
        SECTION_FNS[args.section](args, rec)
    except Exception as exc:
        rec.set(error=f"{type(exc).__name__}: {exc}")
        raise
    rec.set(finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tools.gpu_check ARGV``: the exit status."""
    return run_program(cli, argv)


if __name__ == "__main__":
    sys.exit(main())
