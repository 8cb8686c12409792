"""Each GPU extra resolves to one CUDA line: pip's own resolver report for ``edgecap[gpu-cuNN,tensorrt-cuNN]``.

``pip install --dry-run --ignore-installed --report`` resolves this checkout with the two extras of a line, for Linux
x86_64 and CPython 3.11 (``--only-binary :all:`` with a fixed target, so the answer does not depend on the machine
running the test; onnxruntime-gpu publishes no wheel for some platforms and, from 1.24, none for Python 3.10). Every
package of the answer that belongs to a CUDA line must be on the extras' line: onnxruntime-gpu (the CUDA runtime its
TensorRT provider library links, read from that library's ELF dynamic section inside the wheel, fetched with HTTP
range requests instead of the whole 250 MB wheel), ``tensorrt-cuNN`` and its
``-libs``/``-bindings``, cuda-python and cuda-bindings (their major version), and every ``nvidia-*-cuNN`` library.
Every TensorRT package must have the major version of the ``libnvinfer.so.N`` that onnxruntime-gpu's TensorRT
provider links, and the CPU ``onnxruntime`` must not be there at all.

NVIDIA's ``tensorrt-cuNN`` and ``tensorrt-cuNN-libs`` are source distributions on PyPI. The ``-libs`` one builds with
``wheel-stub``, which has no metadata hook: pip's metadata step builds the wheel, i.e. downloads the real one from
NVIDIA's package index, which this project's machines cannot reach. The sdists' ``PKG-INFO`` is that wheel's
``METADATA`` (wheel-stub copies it when it makes the sdist), so the test offers pip, for the newest release in the
extra's range, a local wheel with that metadata and nothing else; pip resolves everything else from PyPI as a user's
pip would.

Skipped, with the reason, only when PyPI cannot be reached. About 10 s (the two lines resolve in parallel).
"""

from __future__ import annotations

import base64
import concurrent.futures
import email.parser
import functools
import hashlib
import io
import json
import re
import struct
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
SIMPLE = "https://pypi.org/simple"
LINES = (12, 13)
#: The target the reports are resolved for.
TARGET = ("--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
          "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64")  # fmt: skip
#: Unsuffixed NVIDIA wheels (the CUDA 13 naming) whose major version is the CUDA major; the unsuffixed math libraries
#: (cufft, curand, cusparse, ...) carry their own version numbers and are judged by nothing here.
_CUDA_VERSIONED = frozenset({
    "nvidia-cuda-runtime", "nvidia-cuda-nvrtc", "nvidia-cublas", "nvidia-nvjitlink", "nvidia-cuda-cupti", "nvidia-nvtx",
    "nvidia-cuda-nvcc", "nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-nvvm", "cuda-python", "cuda-bindings",
    "cuda-toolkit",
})  # fmt: skip
_TIMEOUT = 60
#: Text in pip's output that means PyPI could not be reached (as opposed to a resolution that failed).
_OFFLINE = ("NewConnectionError", "Max retries exceeded", "ConnectTimeout", "ConnectionError", "ReadTimeout",
            "Temporary failure in name resolution", "Network is unreachable", "ProxyError", "Name or service not known",
            "No route to host", "Connection refused")  # fmt: skip


class RegistryUnreachableError(RuntimeError):
    """PyPI could not be reached: the one reason these tests skip."""


def _get(url: str, headers: Mapping[str, str] | None = None) -> bytes:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=dict(headers or {})), timeout=_TIMEOUT) as r:
            if "Range" in (headers or {}) and r.status != 206:  # a server ignoring the range would send 250 MB
                raise AssertionError(f"{url} answered a range request with HTTP {r.status}")
            return r.read()
    except urllib.error.HTTPError:
        raise
    except OSError as exc:  # URLError, timeouts, DNS: no route to PyPI
        raise RegistryUnreachableError(f"PyPI is unreachable ({url}: {exc})") from None


def _index(project: str) -> dict[str, Any]:
    """PyPI's JSON simple index of ``project`` (PEP 691)."""
    return json.loads(_get(f"{SIMPLE}/{project}/", {"Accept": "application/vnd.pypi.simple.v1+json"}))


# ---------------------------------------------------------------------------------------------------- the checks


def cuda_line(name: str, version: str) -> int | None:
    """The CUDA major a package is built for, from its name (``-cuNN``) or its version; None when neither says."""
    name = canonicalize_name(name)
    suffix = re.search(r"-cu(\d+)(?:-|$)", name)
    if suffix and name.startswith(("nvidia-", "tensorrt")):
        return int(suffix.group(1))
    if name in _CUDA_VERSIONED:
        return Version(version).major
    return None


def tensorrt_major(name: str, version: str) -> int | None:
    """TensorRT's major version for its packages (``tensorrt``, ``tensorrt-cuNN``, ``-libs``, ``-bindings``)."""
    if re.fullmatch(r"tensorrt(-cu\d+)?(-libs|-bindings)?", canonicalize_name(name)):
        return Version(version).major
    return None


def line_problems(
    installed: Mapping[str, str], line: int, onnxruntime_links: Mapping[str, int] | None, needs: Iterable[str]
) -> list[str]:
    """What keeps ``installed`` (name -> version) from being one CUDA ``line``; empty when it is one.

    ``onnxruntime_links``: the ``cuda`` and ``tensorrt`` majors onnxruntime-gpu's TensorRT provider links (None without
    onnxruntime-gpu). ``needs``: packages the extras must have brought (a misspelt extra brings nothing)."""
    installed = {canonicalize_name(n): v for n, v in installed.items()}
    problems = [f"{n} is missing" for n in map(canonicalize_name, needs) if n not in installed]
    if "onnxruntime" in installed:
        problems.append(f"the CPU onnxruntime {installed['onnxruntime']} is in a GPU install")
    for name, version in sorted(installed.items()):
        found = cuda_line(name, version)
        if found is not None and found != line:
            problems.append(f"{name} {version} is CUDA {found}, not {line}")
    if onnxruntime_links is not None:
        gpu_wheel = f"onnxruntime-gpu {installed.get('onnxruntime-gpu')}"
        if onnxruntime_links["cuda"] != line:
            problems.append(
                f"{gpu_wheel} links CUDA {onnxruntime_links['cuda']} "
                f"(libcudart.so.{onnxruntime_links['cuda']}), not {line}"
            )
        for name, version in sorted(installed.items()):
            major = tensorrt_major(name, version)
            if major is not None and major != onnxruntime_links["tensorrt"]:
                problems.append(
                    f"{name} {version} is TensorRT {major}; {gpu_wheel}'s TensorRT provider links "
                    f"libnvinfer.so.{onnxruntime_links['tensorrt']}"
                )
    return problems


def extra_closure(report: Mapping[str, Any], extra: str) -> set[str]:
    """The packages of ``report`` that ``edgecap[extra]`` alone brings (walking each one's ``Requires-Dist``)."""
    meta = {canonicalize_name(i["metadata"]["name"]): i["metadata"] for i in report["install"]}
    env = dict(report["environment"])
    seen: set[str] = set()
    todo = [(Requirement(r), extra) for r in meta["edgecap"].get("requires_dist", [])]
    while todo:
        req, wanted = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**env, "extra": wanted}):
            continue
        name = canonicalize_name(req.name)
        if name == "edgecap":  # an alias extra: edgecap[gpu-cu13]
            todo += [(Requirement(r), e) for e in req.extras for r in meta["edgecap"].get("requires_dist", [])]
            continue
        if name in seen or name not in meta:
            continue
        seen.add(name)
        for sub in req.extras or {""}:
            todo += [(Requirement(r), sub) for r in meta[name].get("requires_dist") or []]
    return seen


# ------------------------------------------------------------------------------- reading a wheel without fetching it


class _RangeFile(io.RawIOBase):
    """A remote file read through HTTP range requests: :mod:`zipfile` reads a 250 MB wheel's directory and one
    member in a few requests."""

    def __init__(self, url: str) -> None:
        self.url, self.pos = url, 0
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=_TIMEOUT) as r:
                self.size = int(r.headers["Content-Length"])
        except urllib.error.HTTPError:
            raise
        except OSError as exc:
            raise RegistryUnreachableError(f"PyPI's files are unreachable ({url}: {exc})") from None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = (0, self.pos, self.size)[whence] + offset
        return self.pos

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.size - self.pos)
        if n <= 0:
            return 0
        data = _get(self.url, {"Range": f"bytes={self.pos}-{self.pos + n - 1}"})[:n]
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def elf_needed(elf: bytes) -> list[str]:
    """The ``DT_NEEDED`` entries (the sonames a shared library links) of a little-endian ELF64 file."""
    if elf[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    for _name, kind, _flags, _addr, offset, size, link, *_ in sections:
        if kind != 6:  # SHT_DYNAMIC
            continue
        strings = sections[link][4]
        needed = []
        for entry in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", elf, entry)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                start = strings + value
                needed.append(elf[start : elf.index(b"\0", start)].decode())
        return needed
    raise ValueError("no dynamic section")


@functools.cache
def onnxruntime_links(url: str) -> dict[str, int]:
    """The CUDA and TensorRT majors the TensorRT provider of the onnxruntime-gpu wheel at ``url`` links."""
    with zipfile.ZipFile(io.BufferedReader(_RangeFile(url), buffer_size=1 << 20)) as wheel:
        member = next(n for n in wheel.namelist() if n.endswith("/libonnxruntime_providers_tensorrt.so"))
        needed = elf_needed(wheel.read(member))
    majors = {}
    for key, soname in (("cuda", "libcudart.so."), ("tensorrt", "libnvinfer.so.")):
        match = next((n for n in needed if n.startswith(soname)), None)
        assert match, f"{member} of {url} links no {soname}N (it links {needed})"
        majors[key] = int(match[len(soname) :].split(".")[0])
    return majors


# ------------------------------------------------------------------------------------- NVIDIA's sdists as wheels


def _extras() -> dict[str, list[str]]:
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib
    except ImportError:  # Python 3.10: pip vendors a TOML reader
        from pip._vendor import tomli as tomllib
    return tomllib.loads(text)["project"]["optional-dependencies"]


def _newest_sdist(project: str, spec: SpecifierSet) -> tuple[str, str]:
    """The newest non-yanked release of ``project`` in ``spec`` and its sdist's URL."""
    files = {}
    for f in _index(project)["files"]:
        if f["filename"].endswith(".tar.gz") and not f.get("yanked"):
            version = f["filename"][: -len(".tar.gz")].rsplit("-", 1)[1]
            files[Version(version)] = f["url"]
    version = max(spec.filter(files), default=None)
    assert version is not None, f"PyPI has no sdist of {project} in {spec} (it has {sorted(map(str, files))})"
    return str(version), files[version]


def _metadata_wheel(folder: Path, sdist_url: str) -> str:
    """A wheel in ``folder`` holding nothing but the ``PKG-INFO`` of the sdist at ``sdist_url`` as its metadata."""
    with tarfile.open(fileobj=io.BytesIO(_get(sdist_url)), mode="r:gz") as tar:
        member = min((m for m in tar.getmembers() if m.name.endswith("PKG-INFO")), key=lambda m: m.name.count("/"))
        metadata = tar.extractfile(member).read()  # type: ignore[union-attr]
    fields = email.parser.BytesHeaderParser().parsebytes(metadata)
    dist = f"{re.sub(r'[-_.]+', '_', fields['Name']).lower()}-{fields['Version']}"
    files = {
        f"{dist}.dist-info/METADATA": metadata,
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: edgecap-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in files.items()
    )
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr(f"{dist}.dist-info/RECORD", record + f"{dist}.dist-info/RECORD,,\n")
    return str(fields["Version"])


def _stand_ins(folder: Path, line: int) -> dict[str, str]:
    """Metadata wheels of the newest ``tensorrt-cuNN`` in the extra's range and of its ``-libs`` (name -> version)."""
    meta = f"tensorrt-cu{line}"
    extras = _extras()
    assert meta in extras, f"pyproject.toml has no [{meta}] extra (it has {sorted(extras)})"
    specs = [Requirement(r).specifier for r in extras[meta] if canonicalize_name(Requirement(r).name) == meta]
    assert len(specs) == 1, f"the [{meta}] extra should name {meta} once: {extras[meta]}"
    spec = specs[0]
    version, url = _newest_sdist(meta, spec)
    _, libs_url = _newest_sdist(f"{meta}-libs", SpecifierSet(f"=={version}"))
    return {meta: _metadata_wheel(folder, url), f"{meta}-libs": _metadata_wheel(folder, libs_url)}


# ---------------------------------------------------------------------------------------------------- the reports


def _resolve(line: int, folder: Path) -> dict[str, Any]:
    wheels = folder / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    stand_ins = _stand_ins(wheels, line)
    report = folder / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--no-input",
           "--report", str(report), "--only-binary", ":all:", *TARGET, "--find-links", str(wheels),
           f"edgecap[gpu-cu{line},tensorrt-cu{line}] @ {ROOT.as_uri()}"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0 and any(marker in done.stderr for marker in _OFFLINE):
        raise RegistryUnreachableError(f"pip could not reach PyPI: {done.stderr.strip().splitlines()[-1]}")
    if done.returncode != 0:
        raise AssertionError(f"pip could not resolve the CUDA {line} extras:\n{done.stderr[-4000:]}")
    return {"report": json.loads(report.read_text()), "stand_ins": stand_ins, "warnings": done.stderr}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """Per CUDA line: pip's report for ``edgecap[gpu-cuNN,tensorrt-cuNN]``, resolved once per test process."""
    try:
        _index("onnxruntime-gpu")
    except RegistryUnreachableError as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("extras")
    with concurrent.futures.ThreadPoolExecutor(len(LINES)) as pool:
        futures = {line: pool.submit(_resolve, line, root / f"cu{line}") for line in LINES}
        try:
            return {line: future.result() for line, future in futures.items()}
        except RegistryUnreachableError as exc:
            pytest.skip(str(exc))


def _installed(report: Mapping[str, Any]) -> dict[str, str]:
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}


def _onnxruntime_url(report: Mapping[str, Any]) -> str:
    return next(i["download_info"]["url"] for i in report["install"] if i["metadata"]["name"] == "onnxruntime-gpu")


# ---------------------------------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("line", LINES)
def test_each_cuda_line_resolves_to_one_cuda(reports: dict[int, dict[str, Any]], line: int) -> None:
    resolved = reports[line]
    report = resolved["report"]
    assert "does not provide the extra" not in resolved["warnings"], resolved["warnings"]
    installed = _installed(report)
    for name, version in resolved["stand_ins"].items():  # NVIDIA's sdists: the newest in range, as a user gets
        assert installed.get(name) == version, (name, installed.get(name), version)
    try:
        links = onnxruntime_links(_onnxruntime_url(report))
    except RegistryUnreachableError as exc:
        pytest.skip(str(exc))
    needs = ("onnxruntime-gpu", "nvidia-ml-py", f"tensorrt-cu{line}", f"tensorrt-cu{line}-libs",
             f"tensorrt-cu{line}-bindings", "cuda-python", "onnx")  # fmt: skip
    problems = line_problems(installed, line, links, needs)
    assert not problems, f"edgecap[gpu-cu{line},tensorrt-cu{line}] resolves to {sorted(installed.items())}:\n" + (
        "\n".join(problems)
    )


@pytest.mark.parametrize("line", LINES)
def test_the_tensorrt_extra_reads_graphs_without_onnxruntime(reports: dict[int, dict[str, Any]], line: int) -> None:
    """``edgecap engine`` reads the graphs with onnx; the tensorrt extra brings no onnxruntime of either kind (the
    CPU one would shadow a GPU one, and the engines do not need it)."""
    alone = extra_closure(reports[line]["report"], f"tensorrt-cu{line}")
    assert {"onnx", f"tensorrt-cu{line}", "cuda-python"} <= alone, sorted(alone)
    assert not {"onnxruntime", "onnxruntime-gpu"} & alone, sorted(alone)
    gpu = extra_closure(reports[line]["report"], f"gpu-cu{line}")
    assert "onnxruntime-gpu" in gpu and not any(n.startswith(("tensorrt", "cuda-")) for n in gpu), sorted(gpu)


def test_the_unnamed_extras_are_one_line() -> None:
    """``[gpu]`` and ``[tensorrt]`` (requirements written before the lines had names) are the CUDA 13 line's."""
    extras = _extras()
    assert extras["gpu"] == ["edgecap[gpu-cu13]"] and extras["tensorrt"] == ["edgecap[tensorrt-cu13]"]
    gpu_extras = [name for name in extras if name.startswith(("gpu", "tensorrt"))]
    resolved = [f"{kind}-cu{line}" for line in LINES for kind in ("gpu", "tensorrt")]
    assert sorted(gpu_extras) == sorted(["gpu", "tensorrt", *resolved]), f"a GPU extra of a line not in {LINES}"
    for name in gpu_extras:
        assert not any(canonicalize_name(Requirement(r).name) == "onnxruntime" for r in extras[name]), name


def test_the_check_catches_a_mixed_install() -> None:
    """What the unnamed extras resolved to before the lines had names: TensorRT 11 beside an onnxruntime-gpu whose
    TensorRT provider links TensorRT 10; a CUDA 12 onnxruntime-gpu with cuda-python 13; the CPU onnxruntime."""
    old = {"onnxruntime-gpu": "1.31.1", "nvidia-ml-py": "13.615.71", "tensorrt": "11.4.0.106",
           "tensorrt-cu13": "11.4.0.106", "tensorrt-cu13-libs": "11.4.0.106", "tensorrt-cu13-bindings": "11.4.0.106",
           "cuda-python": "13.4.4", "cuda-bindings": "13.5.0"}  # fmt: skip
    problems = line_problems(old, 13, {"cuda": 13, "tensorrt": 10}, ("onnxruntime-gpu", "onnx"))
    assert "onnx is missing" in problems
    assert sum("is TensorRT 11; onnxruntime-gpu 1.31.1's TensorRT provider links libnvinfer.so.10" in p
               for p in problems) == 4  # fmt: skip
    cu12 = {"onnxruntime-gpu": "1.26.0", "tensorrt-cu12": "10.16.1.11", "cuda-python": "13.4.4",
            "nvidia-cudnn-cu13": "9.24.0.43", "nvidia-cuda-runtime": "13.0.96", "nvidia-curand": "10.4.0.35",
            "onnxruntime": "1.32.0"}  # fmt: skip
    assert sorted(line_problems(cu12, 12, {"cuda": 12, "tensorrt": 10}, ())) == [
        "cuda-python 13.4.4 is CUDA 13, not 12",
        "nvidia-cuda-runtime 13.0.96 is CUDA 13, not 12",
        "nvidia-cudnn-cu13 9.24.0.43 is CUDA 13, not 12",
        "the CPU onnxruntime 1.32.0 is in a GPU install",
    ]
    assert line_problems(cu12, 13, {"cuda": 12, "tensorrt": 10}, ())[-1].endswith(
        "links CUDA 12 (libcudart.so.12), not 13"
    )
