"""The edge runtime's footprint: a runtime-only install on disk, peak RSS over 100 captions, cold start to a caption.

Given a bundle, :func:`measure_footprint` builds runtime-only venvs (``tools.edge_install``) and measures, in
fresh processes of each:

- **env size**: the venv on disk (allocated blocks, as ``du``), with and without pip/setuptools themselves, and the
  largest packages;
- **peak RSS**: the high-water mark (``VmHWM``, which ``exec`` resets) of a child that loads the bundle with
  ``Captioner.load`` and captions N images (100); ``wait4``'s ``ru_maxrss`` where there is no ``/proc`` (it keeps
  what the child shared with its parent before ``exec``, so a parent with torch loaded inflates it);
- **cold start**: from ``import edgecap`` to the first caption, the median of ≥ 5 fresh processes (import, load and
  first-caption splits reported too).

Targets: env ≤ 150 MB, peak RSS ≤ 200 MB, cold start ≤ 1.0 s. The job is ``tests/jobs/test_edge_footprint.py``
(``python -m pytest -m footprint``; docs/benchmarks.md, "The edge runtime"), which writes ``edge_runtime.json`` and
``edge_runtime.md``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tools.edge_install import VARIANTS, build_runtime_venv, clean_env, variant_python, venv_size
from tools.files import write_json, write_text

TARGETS = {"env_mb": 150.0, "rss_mb": 200.0, "cold_start_s": 1.0}


# -- measurements in fresh processes ---------------------------------------------------------------------------------
#: One child: import edgecap, load the bundle, caption the images; prints timings and what was imported.
CHILD = r"""
import time
t0 = time.perf_counter()
import edgecap
from edgecap.runtime.captioner import Captioner
t1 = time.perf_counter()
import json, sys
bundle, count, batch = sys.argv[1], int(sys.argv[3]), int(sys.argv[4])
images = json.loads(open(sys.argv[2]).read())
with Captioner.load(bundle) as cap:
    t2 = time.perf_counter()
    first = cap(images[0])
    t3 = time.perf_counter()
    captions = [first]
    rest = [images[i % len(images)] for i in range(1, count)]
    for start in range(0, len(rest), batch):
        captions += cap.batch(rest[start : start + batch], batch_size=batch)
    info = cap.runtime_info.get("summary")
try:
    with open("/proc/self/status") as status:
        hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
except (OSError, StopIteration):
    hwm = None
print(json.dumps({
    "import_s": t1 - t0, "load_s": t2 - t1, "first_caption_s": t3 - t2, "cold_start_s": t3 - t0,
    "captions": len(captions), "first": first, "runtime": info, "edgecap": edgecap.__file__,
    "torch_imported": "torch" in sys.modules, "vm_hwm_kib": hwm,
}))
"""


def run_child(
    python: str | Path, bundle: Path, images: Path, count: int, batch: int, env: Mapping[str, str]
) -> dict[str, Any]:
    """One fresh process captioning ``count`` images; its own report plus ``peak_rss_mb`` (its ``VmHWM``, else
    ``wait4``'s ``ru_maxrss``) and ``wall_s`` (interpreter start included)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(
            [str(python), "-c", CHILD, str(bundle), str(images), str(count), str(batch)],
            stdout=out,
            stderr=err,
            env=dict(env),
            cwd=tempfile.gettempdir(),  # ``python -c`` puts the working directory first on sys.path: not a checkout
        )
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if process.returncode != 0:
        lines = stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit code {process.returncode}", "stderr": stderr[-2000:]}
    result = json.loads(stdout.strip().splitlines()[-1])
    peak_kib = result.pop("vm_hwm_kib", None) or usage.ru_maxrss  # Linux: KiB
    result.update(peak_rss_mb=round(peak_kib / 1024, 1), wall_s=wall)
    return result


def measure_env(
    name: str, python: str | Path, bundle: Path, images: Path, count: int, cold_runs: int, batch: int,
    env: Mapping[str, str],
) -> dict[str, Any]:  # fmt: skip
    """Peak RSS over ``count`` captions (one process) and the cold start over ``cold_runs`` one-caption processes."""
    rss = run_child(python, bundle, images, count, batch, env)
    if "error" in rss:
        return {"name": name, "error": rss["error"], "stderr": rss.get("stderr")}
    cold = [run_child(python, bundle, images, 1, 1, env) for _ in range(cold_runs)]
    failed = [c for c in cold if "error" in c]
    if failed:
        return {"name": name, "error": failed[0]["error"], "rss": rss}
    median = {
        k: statistics.median(c[k] for c in cold) for k in ("cold_start_s", "import_s", "load_s", "first_caption_s")
    }
    return {
        "name": name,
        "runtime": rss["runtime"],
        "edgecap": rss["edgecap"],
        "torch_imported": rss["torch_imported"] or any(c["torch_imported"] for c in cold),
        "images": rss["captions"],
        "peak_rss_mb": rss["peak_rss_mb"],
        "cold_start_runs": cold_runs,
        "cold_start_s": [round(c["cold_start_s"], 4) for c in cold],
        "median": {k: round(v, 4) for k, v in median.items()},
        "process_wall_median_s": round(statistics.median(c["wall_s"] for c in cold), 4),
        "first_caption": rss["first"],
    }


def write_image_list(images: Path | None, out: Path, count: int) -> Path:
    """A JSON list of image files: ``images``'s, or ``count`` generated JPEGs (random noise: the caption content does
    not matter for memory and timing, only the decode length, which the bundle caps)."""
    suffixes = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}
    if images is not None:
        paths = sorted(str(p) for p in images.rglob("*") if p.suffix.lower() in suffixes)
        if not paths:
            raise FileNotFoundError(f"{images}: no image files")
    else:
        import numpy as np
        from PIL import Image

        folder = out / "images"
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        paths = []
        for i in range(min(count, 16)):  # cycled: 16 distinct inputs are enough
            path = folder / f"noise-{i:02d}.jpg"
            Image.fromarray(rng.integers(0, 256, (256, 320, 3), dtype=np.uint8)).save(path, quality=90)
            paths.append(str(path))
    listing = out / "images.json"
    listing.write_text(json.dumps(paths))
    return listing


# -- the report ------------------------------------------------------------------------------------------------------
def _check(value: float | None, target: float) -> str:
    if value is None:
        return "–"
    return f"{value:g} ({'meets' if value <= target else 'misses'} ≤ {target:g})"


def format_markdown(report: Mapping[str, Any]) -> str:
    """``edge_runtime.md``: one row per environment, the targets judged, and the largest packages."""
    lines = [
        "# Edge runtime footprint",
        "",
        f"Bundle `{report['bundle']}`, {report['images']} images per RSS run, cold start = median of "
        f"{report['cold_runs']} fresh processes from `import edgecap` to the first caption. "
        f"Created {report['created']}.",
        "",
        "| environment | venv MB / without pip, setuptools | peak RSS MB | cold start s "
        "| import / load / first caption s | torch imported | runtime |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for row in report["environments"]:
        size = row.get("size") or {}
        env_mb = size.get("without_installer_mb")
        env_cell = f"{size['total_mb']:g} / {_check(env_mb, TARGETS['env_mb'])}" if size else "n/a (this env)"
        if "error" in row:
            lines.append(f"| {row['name']} | {env_cell} | failed: {row['error']} | | | | |")
            continue
        m = row["median"]
        split = f"{m['import_s']:.3f} / {m['load_s']:.3f} / {m['first_caption_s']:.3f}"
        lines.append(
            f"| {row['name']} | {env_cell} | {_check(row['peak_rss_mb'], TARGETS['rss_mb'])} "
            f"| {_check(round(m['cold_start_s'], 3), TARGETS['cold_start_s'])} | {split} | {row['torch_imported']} "
            f"| {row['runtime']} |"
        )
    lines += ["", "## Installs", ""]
    for row in report["environments"]:
        venv = row.get("venv")
        if not venv:
            continue
        how = f"`pip install {' '.join([venv['requirement'], *venv['pins']])}`"
        packages = ", ".join(f"{k} {v}" for k, v in sorted(venv["packages"].items()))
        largest = ", ".join(f"{k} {v:g}" for k, v in row["size"]["largest_mb"].items())
        lines += [
            f"- **{row['name']}**: {how} in {venv['install_s']:.0f} s; packages: {packages}.",
            f"  Largest (MB): {largest}; pip/setuptools {row['size']['installer_mb']:g} MB.",
        ]
    return "\n".join(lines) + "\n"


def measure_footprint(
    bundle: Path,
    out: Path,
    *,
    images: Path | None = None,
    count: int = 100,
    cold_runs: int = 5,
    batch_size: int = 1,
    variants: Sequence[str] = ("cpu",),
    venv_root: Path | None = None,
    compare_current: bool = False,
) -> dict[str, Any]:
    """Build a venv per variant (under ``venv_root``, default ``out``; kept for reuse), measure each, and write
    ``edge_runtime.json`` and ``edge_runtime.md`` into ``out``; returns the report. ``compare_current`` measures this
    interpreter's full environment as well.

    Raises:
        ValueError: fewer than 5 cold runs, or an unknown variant.
    """
    if cold_runs < 5:
        raise ValueError(f"cold_runs must be >= 5, got {cold_runs}")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    out.mkdir(parents=True, exist_ok=True)
    bundle = bundle.resolve()
    listing = write_image_list(images.resolve() if images else None, out.resolve(), count)
    home = tempfile.mkdtemp(prefix="edgecap-home-")
    environments = []
    for variant in variants:
        venv = build_runtime_venv(
            (venv_root or out) / f"venv-{variant}", pins=VARIANTS[variant], python=variant_python(variant)
        )
        print(f"{variant}: venv at {venv.path}", file=sys.stderr)
        env = clean_env({"EDGECAP_HOME": home})
        row = measure_env(variant, venv.python, bundle, listing, count, cold_runs, batch_size, env)
        row.update(size=venv_size(venv), venv={**asdict(venv), "path": str(venv.path)})
        environments.append(row)
    if compare_current:
        import edgecap  # the package this process runs, with everything installed beside it

        package_parent = str(Path(edgecap.__file__).resolve().parents[1])
        env = clean_env({"EDGECAP_HOME": home, "PYTHONPATH": package_parent})
        environments.append(
            measure_env("current (full)", sys.executable, bundle, listing, count, cold_runs, batch_size, env)
        )
    report = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bundle": str(bundle),
        "images": count,
        "cold_runs": cold_runs,
        "batch_size": batch_size,
        "targets": TARGETS,
        "environments": environments,
    }
    write_json(out / "edge_runtime.json", report)
    write_text(out / "edge_runtime.md", format_markdown(report))
    return report
