"""The edge runtime's footprint: a runtime-only install on disk, peak RSS over 100 captions, cold start to a caption.

Given a bundle, this builds a fresh virtual environment (``python -m venv``) with ``pip install "<repo>[cpu]"``
(non-editable, from a clean copy of the sources), then measures, in fresh processes of that environment:

- **env size**: the venv on disk (allocated blocks, as ``du``), with and without pip/setuptools themselves, and the
  largest packages;
- **peak RSS**: ``ru_maxrss`` of a child that loads the bundle with ``Captioner.load`` and captions N images (100),
  read by the parent with ``wait4`` so it is exactly that process's high-water mark;
- **cold start**: from ``import edgecap`` to the first caption, the median of ≥ 5 fresh processes (import, load and
  first-caption splits reported too).

Variants: ``cpu`` (the current ``[cpu]`` extra) and ``oldest-ort`` (the same with the oldest supported ONNX Runtime,
1.18.1, and the numpy 1.x it was built against). ``--compare-current`` measures RSS and cold start in this
interpreter's full environment as well.

Targets (the edge-runtime issue): env ≤ 150 MB, peak RSS ≤ 200 MB, cold start ≤ 1.0 s. Usage::

    python benchmarks/edge_runtime.py BUNDLE --images DIR --out /tmp/edge [--variants cpu,oldest-ort] \
        [--compare-current]

Writes ``edge_runtime.json`` and ``edge_runtime.md`` (atomically) into ``--out``.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: What ``pip install "<repo>[cpu]"`` adds per variant: the oldest supported ONNX Runtime needs numpy 1.x.
VARIANTS: dict[str, tuple[str, ...]] = {
    "cpu": (),
    "oldest-ort": ("onnxruntime==1.18.1", "numpy<2"),
    "py310": (),  # the oldest supported Python (JetPack 6's), with the newest packages that support it
}
#: Variants built with another interpreter than this one: variant -> the ``pythonX.Y`` executable name.
VARIANT_PYTHONS: dict[str, str] = {"py310": "python3.10"}


def find_python(name: str) -> str | None:
    """A working interpreter called ``name`` (``python3.10``): on PATH, or in a pyenv install; None when absent."""
    candidates = [shutil.which(name), *sorted(glob.glob(str(Path.home() / ".pyenv" / "versions" / "*" / "bin" / name)))]
    for candidate in filter(None, candidates):
        done = subprocess.run([candidate, "-c", "import venv"], capture_output=True, check=False)
        if done.returncode == 0:
            return candidate
    return None


def variant_python(variant: str) -> str | None:
    """The interpreter a variant is built with: None for this one's.

    Raises:
        FileNotFoundError: the variant needs an interpreter this machine lacks.
    """
    name = VARIANT_PYTHONS.get(variant)
    if name is None:
        return None
    found = find_python(name)
    if found is None:
        raise FileNotFoundError(f"variant {variant!r} needs {name}, which is not installed here")
    return found


TARGETS = {"env_mb": 150.0, "rss_mb": 200.0, "cold_start_s": 1.0}
#: Installed by ``venv`` for installing, not needed to run: reported apart from the runtime's own size.
INSTALLER_PACKAGES = ("pip", "setuptools", "pkg_resources", "_distutils_hack", "wheel", "distutils-precedence.pth")
_MARKER = "edgecap-runtime-venv.json"
#: Files of the repository a wheel is built from (a clean copy: no build/ or egg-info lands in the checkout).
_SOURCE_FILES = ("pyproject.toml", "README.md", "LICENSE", "LICENSE.txt", "setup.cfg", "MANIFEST.in")


# -- the runtime-only environment ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RuntimeVenv:
    """A built runtime environment.

    Attributes:
        path: the venv directory.
        requirement: what pip installed edgecap as (``<repo>[cpu]``) and ``pins`` beside it.
        install_s: seconds to create and fill it (0 when reused).
        packages: distribution name -> version, as installed.
    """

    path: Path
    requirement: str
    pins: tuple[str, ...]
    install_s: float
    packages: dict[str, str] = field(default_factory=dict)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def edgecap(self) -> Path:
        """The installed ``edgecap`` console script."""
        return self.path / "bin" / "edgecap"

    def run(self, code: str, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
        """``python -c code args`` in this venv, in a clean environment and outside any checkout (no PYTHONPATH, and
        the working directory is the venv, so ``import edgecap`` finds the installed copy)."""
        return subprocess.run(
            [str(self.python), "-c", code, *args],
            capture_output=True,
            text=True,
            env=clean_env(env),
            cwd=self.path,
            check=False,
        )


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment for a child that must see only its own interpreter's packages."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "EDGECAP_HOME", "OMP_NUM_THREADS")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a measurement must not leave new .pyc files in the measured venv
    env.update(extra or {})
    return env


def _source_digest(repo: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted([*(repo / "edgecap").rglob("*.py"), *(repo / n for n in _SOURCE_FILES)]):
        if path.is_file():
            digest.update(str(path.relative_to(repo)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _copy_sources(repo: Path, dest: Path) -> Path:
    """The files a wheel of edgecap is built from, copied to ``dest`` (pip builds in tree)."""
    dest.mkdir(parents=True)
    for name in _SOURCE_FILES:
        if (repo / name).is_file():
            shutil.copy2(repo / name, dest / name)
    shutil.copytree(repo / "edgecap", dest / "edgecap", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _pip(python: Path, *args: str) -> None:
    done = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, env=clean_env())
    if done.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}")


def build_runtime_venv(
    dest: str | Path,
    repo: str | Path = ROOT,
    *,
    extra: str | None = "cpu",
    pins: Sequence[str] = (),
    python: str | Path | None = None,
    reuse: bool = True,
) -> RuntimeVenv:
    """Create ``dest`` with ``python -m venv`` and install edgecap into it from ``repo``, non-editable.

    Args:
        dest: the venv directory (replaced unless ``reuse`` finds it built from the same request and sources).
        repo: the source checkout.
        extra: the extra to install (``"cpu"``: ``pip install "<repo>[cpu]"``); None for none.
        pins: more requirements in the same pip call (``onnxruntime==1.18.1``, ``numpy<2``), so the resolver
            picks versions that satisfy edgecap's declared ranges and these together.
        python: the interpreter the venv is made from (default: this one's base interpreter).
        reuse: keep an existing venv whose marker records the same request and source digest.

    Raises:
        RuntimeError: venv creation or pip failed (pip's stderr tail in the message).
    """
    dest, repo = Path(dest), Path(repo)
    interpreter = str(python or getattr(sys, "_base_executable", None) or sys.executable)
    request = {
        "extra": extra,
        "python": interpreter,
        "pins": list(pins),
        "sources": _source_digest(repo),
    }
    marker = dest / _MARKER
    if reuse and marker.is_file():
        recorded = json.loads(marker.read_text())
        if recorded.get("request") == request:
            return _venv_from_marker(dest, recorded)
    if dest.exists():
        shutil.rmtree(dest)
    start = time.perf_counter()
    subprocess.run([interpreter, "-m", "venv", str(dest)], check=True, capture_output=True, env=clean_env())
    venv_python = dest / "bin" / "python"
    with tempfile.TemporaryDirectory(prefix="edgecap-src-") as tmp:
        source = _copy_sources(repo, Path(tmp) / "edgecap-src")
        _pip(venv_python, "install", "--no-cache-dir", f"{source}[{extra}]" if extra else str(source), *pins)
    requirement = f"{repo}[{extra}]" if extra else str(repo)
    install_s = time.perf_counter() - start
    listed = subprocess.run(
        [str(venv_python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, env=clean_env()
    )
    packages = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout or "[]")}
    record = {
        "request": request,
        "requirement": requirement,
        "install_s": install_s,
        "packages": packages,
    }
    marker.write_text(json.dumps(record, indent=2) + "\n")
    return _venv_from_marker(dest, record, install_s)


def _venv_from_marker(dest: Path, record: Mapping[str, Any], install_s: float = 0.0) -> RuntimeVenv:
    return RuntimeVenv(
        path=dest,
        requirement=record["requirement"],
        pins=tuple(record["request"]["pins"]),
        install_s=install_s,
        packages=dict(record["packages"]),
    )


def _disk_bytes(path: Path) -> int:
    """Allocated bytes under ``path`` (``du``'s count: blocks, links not followed, hard links once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for item in [path, *path.rglob("*")]:
        st = item.lstat()
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        total += st.st_blocks * 512
    return total


def _is_installer(name: str) -> bool:
    base = name.split("-")[0].lower() if name.endswith(".dist-info") else name.lower()
    return base in INSTALLER_PACKAGES or name.lower() in INSTALLER_PACKAGES


def venv_size(venv: RuntimeVenv, top: int = 8) -> dict[str, Any]:
    """The venv's size in MB, without pip/setuptools (and their console scripts), and its largest packages."""
    mb = 1 << 20
    total = _disk_bytes(venv.path)
    site = next(venv.path.glob("lib/python*/site-packages"))
    entries = {p.name: _disk_bytes(p) for p in site.iterdir()}
    installer = sum(size for name, size in entries.items() if _is_installer(name))
    installer += sum(_disk_bytes(p) for p in (venv.path / "bin").glob("pip*"))
    largest = sorted(((n, s) for n, s in entries.items() if not _is_installer(n)), key=lambda e: -e[1])[:top]
    return {
        "total_mb": round(total / mb, 1),
        "without_installer_mb": round((total - installer) / mb, 1),
        "installer_mb": round(installer / mb, 1),
        "largest_mb": {name: round(size / mb, 1) for name, size in largest},
    }


# -- measurements in fresh processes ---------------------------------------------------------------------------------
#: One child: import edgecap, load the bundle, caption the images; prints timings and what was imported.
CHILD = r"""
import time
t0 = time.perf_counter()
import edgecap
from edgecap.captioner import Captioner
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
print(json.dumps({
    "import_s": t1 - t0, "load_s": t2 - t1, "first_caption_s": t3 - t2, "cold_start_s": t3 - t0,
    "captions": len(captions), "first": first, "runtime": info, "edgecap": edgecap.__file__,
    "torch_imported": "torch" in sys.modules,
}))
"""


def run_child(
    python: str | Path, bundle: Path, images: Path, count: int, batch: int, env: Mapping[str, str]
) -> dict[str, Any]:
    """One fresh process captioning ``count`` images; its own report plus ``peak_rss_mb`` (``wait4``'s
    ``ru_maxrss``) and ``wall_s`` (interpreter start included)."""
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
    result.update(peak_rss_mb=round(usage.ru_maxrss / 1024, 1), wall_s=wall)  # Linux: KiB
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


def _image_list(images: Path | None, out: Path, count: int) -> Path:
    """A JSON list of image files: ``images``'s, or ``count`` generated JPEGs (random noise: the caption content does
    not matter for memory and timing, only the decode length, which the bundle caps)."""
    suffixes = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}
    if images is not None:
        paths = sorted(str(p) for p in images.rglob("*") if p.suffix.lower() in suffixes)
        if not paths:
            raise SystemExit(f"--images {images}: no image files")
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--images", type=Path, default=None, help="Image directory (default: generated JPEGs).")
    parser.add_argument("--count", type=int, default=100, help="Images captioned in the peak-RSS process.")
    parser.add_argument("--cold-runs", type=int, default=5, help="Fresh processes for the cold start (>= 5).")
    parser.add_argument("--batch-size", type=int, default=1, help="Images per Captioner.batch call (1: streaming).")
    parser.add_argument("--variants", default="cpu", help=f"Comma-separated: {', '.join(VARIANTS)}.")
    parser.add_argument("--venv-root", type=Path, default=None, help="Where the venvs go (kept; default: --out).")
    parser.add_argument("--compare-current", action="store_true", help="Also measure this interpreter's env.")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.cold_runs < 5:
        parser.error("--cold-runs must be >= 5")
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    sys.path.insert(0, str(ROOT))
    from edgecap._io import atomic_write_json, atomic_write_text

    args.out.mkdir(parents=True, exist_ok=True)
    bundle = args.bundle.resolve()
    images = _image_list(args.images.resolve() if args.images else None, args.out.resolve(), args.count)
    home = tempfile.mkdtemp(prefix="edgecap-home-")
    environments = []
    for variant in variants:
        venv = build_runtime_venv(
            (args.venv_root or args.out) / f"venv-{variant}",
            pins=VARIANTS[variant],
            python=variant_python(variant),
        )
        print(f"{variant}: venv at {venv.path}", file=sys.stderr)
        env = clean_env({"EDGECAP_HOME": home})
        row = measure_env(variant, venv.python, bundle, images, args.count, args.cold_runs, args.batch_size, env)
        row.update(size=venv_size(venv), venv={**asdict(venv), "path": str(venv.path)})
        environments.append(row)
    if args.compare_current:
        env = clean_env({"EDGECAP_HOME": home, "PYTHONPATH": str(ROOT)})
        row = measure_env(
            "current (full)", sys.executable, bundle, images, args.count, args.cold_runs, args.batch_size, env
        )
        environments.append(row)
    report = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bundle": str(bundle),
        "images": args.count,
        "cold_runs": args.cold_runs,
        "batch_size": args.batch_size,
        "targets": TARGETS,
        "environments": environments,
    }
    atomic_write_json(args.out / "edge_runtime.json", report)
    atomic_write_text(args.out / "edge_runtime.md", format_markdown(report))
    print(format_markdown(report))
    return 1 if any("error" in row for row in environments) else 0


if __name__ == "__main__":
    sys.exit(main())
