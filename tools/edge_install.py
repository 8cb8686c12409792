"""Runtime-only virtual environments: ``python -m venv`` plus ``pip install "<repo>[cpu]"`` (non-editable, from a
clean copy of the sources), built once and reused while the sources and the request are the same.

``tests/test_edge_install.py`` checks what such an install can do (no torch, the same captions, ``edgecap bench``);
``tools.edge_footprint`` measures what it costs (disk, peak RSS, cold start). Variants: ``cpu`` (the current
``[cpu]`` extra), ``oldest-onnxruntime`` (the oldest supported ONNX Runtime, 1.18.1, on the numpy 1.x it was built
against) and
``py310`` (the oldest supported Python, where installed).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The repository root (the folder above ``tools/``): the checkout a venv is built from.
ROOT = Path(__file__).resolve().parents[1]
#: What ``pip install "<repo>[cpu]"`` adds per variant: the oldest supported ONNX Runtime needs numpy 1.x.
VARIANTS: dict[str, tuple[str, ...]] = {
    "cpu": (),
    "oldest-onnxruntime": ("onnxruntime==1.18.1", "numpy<2"),
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
        """The venv's interpreter."""
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
    sources = [*(repo / "edgecap").rglob("*.py"), *(repo / "edgecap").rglob("*.schema.json")]  # + package data
    for path in sorted([*sources, *(repo / n for n in _SOURCE_FILES)]):
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
