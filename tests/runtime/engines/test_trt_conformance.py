"""edgecap's TensorRT code and its test fake against NVIDIA's real Python bindings, on a machine without a GPU.

For the oldest and newest supported 10.x (10.3, JetPack 6's; 10.16) and for 11.4, the real ``tensorrt_bindings`` wheel
is downloaded once into the test cache and imported in a subprocess over stub libraries whose entry points return NULL
(:mod:`tests.runtime.engines.real_trt`). There, the surface edgecap uses is re-extracted and must equal
``trt_surface.json``,
which the fake (:mod:`tests.runtime.engines.fake_trt`) is generated from and checked against; edgecap's settings
decisions
must be the same on the real module as on the fake; edgecap's data-type table must agree with ``trt.nptype``;
``trt.Builder``/``trt.Runtime`` must fail as they do without CUDA and edgecap must say so in a sentence. Statically,
every ``trt.X.Y`` edgecap names must exist in every version and every call of a recorded method must fit one of the
real overloads. Skipped only when the package index cannot be reached (or off Linux, where the bindings cannot load).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from edgecap.runtime.engines.settings import EngineSettingsError, build_settings
from tests.runtime.engines.fake_trt import NULL_FACTORY, SURFACES, check_fake, fake_tensorrt
from tests.runtime.engines.real_trt import WHEELS, RealTrt, RegistryUnreachableError, cache_root, prepare, run_real
from tests.runtime.engines.real_trt import unsupported_platform as _unsupported
from tests.runtime.engines.trt_surface import dump, overload_params

ROOT = Path(__file__).resolve().parents[3]
#: edgecap's modules that call TensorRT.
TRT_MODULES = (
    "edgecap/runtime/engines/build.py",
    "edgecap/runtime/engines/settings.py",
    "edgecap/runtime/engines/tensorrt_api.py",
    "edgecap/runtime/backends/tensorrt/runtime.py",
    "edgecap/runtime/backends/tensorrt/engines.py",
)
PRECISIONS = ("fp32", "fp16", "int8")
TYPINGS = ("auto", "strong", "weak")

#: Run with the real module as ``tensorrt`` (the meta package's shim over ``tensorrt_bindings``); JSON on stdout.
PROBE = """
import json
import tensorrt as trt
import tensorrt_bindings
from edgecap.runtime.engines import tensorrt_api
from tests.runtime.engines.test_trt_conformance import decisions
from tests.runtime.engines.trt_surface import extract

out = {"surface": extract(tensorrt_bindings), "shim": trt.Builder is tensorrt_bindings.Builder}
out["settings"] = decisions(trt)
out["logger"] = type(trt.Logger(trt.Logger.WARNING)).__name__
for kind in ("Builder", "Runtime"):
    try:
        getattr(trt, kind)(trt.Logger(trt.Logger.WARNING))
        out[kind] = "started"
    except TypeError as exc:
        out[kind] = str(exc)
    try:
        tensorrt_api.start(trt, kind)
        out["start " + kind] = "started"
    except tensorrt_api.EngineUnavailableError as exc:
        out["start " + kind] = str(exc)
numpy = {name: tensorrt_api.numpy_dtype(member) for name, member in trt.DataType.__members__.items()}
out["numpy"] = {name: None if dtype is None else dtype.name for name, dtype in numpy.items()}
print(json.dumps(out))
"""


def decisions(trt: Any) -> dict[str, Any]:
    """What :func:`build_settings` decides for every precision and typing on ``trt`` (or why it refuses)."""
    out: dict[str, Any] = {}
    for precision in PRECISIONS:
        for typing in TYPINGS:
            try:
                s = build_settings(trt, precision, typing)
            except EngineSettingsError as exc:
                out[f"{precision}/{typing}"] = str(exc)
            else:
                out[f"{precision}/{typing}"] = [s.strongly_typed, s.network_flags, list(s.builder_flags)]
    return out


@pytest.fixture(scope="module")
def real(request: pytest.FixtureRequest) -> dict[str, RealTrt]:
    """Each version's bindings, importable (downloaded once into the test cache)."""
    reason = _unsupported()
    if reason:
        pytest.skip(reason)
    root = cache_root(request)
    out = {}
    for version in WHEELS:
        try:
            out[version] = prepare(version, root)
        except RegistryUnreachableError as exc:
            pytest.skip(f"the real TensorRT bindings cannot be downloaded: {exc}")
    return out


@pytest.fixture(scope="module")
def probed(real: dict[str, RealTrt]) -> dict[str, dict[str, Any]]:
    """:data:`PROBE`'s answer per version (one subprocess each)."""
    out = {}
    for version, bindings in real.items():
        done = run_real(bindings, PROBE)
        assert done.returncode == 0, f"TensorRT {version}: {done.stderr[-3000:]}"
        out[version] = json.loads(done.stdout)
    return out


@pytest.mark.parametrize("version", list(WHEELS))
def test_the_recorded_surface_is_the_real_modules(probed, version: str) -> None:
    real, recorded = probed[version]["surface"], SURFACES[version]
    if real != recorded:
        got, want = dump({version: real}).splitlines(), dump({version: recorded}).splitlines()
        import difflib

        diff = "\n".join(difflib.unified_diff(want, got, "trt_surface.json", f"TensorRT {version}", lineterm="", n=1))
        pytest.fail(f"TensorRT {version} differs from trt_surface.json (python -m tests.runtime.engines.trt_surface "
                    f"--write, then fix the fake):\n{diff[:6000]}")  # fmt: skip
    assert probed[version]["shim"], "the tensorrt shim does not re-export tensorrt_bindings"
    assert probed[version]["logger"] == "Logger"


@pytest.mark.parametrize("version", list(WHEELS))
def test_the_fake_is_the_recorded_surface(version: str) -> None:
    fake = fake_tensorrt(version)
    assert check_fake(fake, SURFACES[version]) == []
    assert fake.__version__ == SURFACES[version]["version"]
    fake.Zeta = object()  # a name TensorRT lacks is noticed
    assert check_fake(fake, SURFACES[version]) == ["tensorrt.Zeta is not in the real module's recorded surface"]


def test_the_values_edgecap_depends_on() -> None:
    flags = {v: SURFACES[v]["enums"]["NetworkDefinitionCreationFlag"] for v in WHEELS}
    assert [flags[v]["STRONGLY_TYPED"] for v in WHEELS] == [1, 1, 0]  # bit 0 is 10.x's deprecated EXPLICIT_BATCH
    assert "EXPLICIT_BATCH" in flags["10.3"] and "EXPLICIT_BATCH" not in flags["11.4"]
    for version in WHEELS:
        builder_flags = SURFACES[version]["enums"]["BuilderFlag"]
        weak = {"FP16", "INT8"} <= set(builder_flags)
        assert weak == version.startswith("10."), version  # settings.py reads weak typing from these two
        assert SURFACES[version]["enums"]["TensorIOMode"] == {"NONE": 0, "INPUT": 1, "OUTPUT": 2}
        assert SURFACES[version]["classes"]["IHostMemory"]["buffer"]  # bytes(plan)
        assert SURFACES[version]["nptype"]["BF16"] is None  # trt.nptype raises for bfloat16


@pytest.mark.parametrize("version", list(WHEELS))
def test_settings_decide_alike_on_the_real_module_and_the_fake(probed, version: str) -> None:
    real = probed[version]["settings"]
    assert real == decisions(fake_tensorrt(version))
    if version.startswith("11."):
        assert "no weak typing" in real["int8/weak"] and real["int8/auto"] == [True, 1, []]
    else:
        assert real["int8/weak"] == [False, 0, ["INT8", "FP16"]] and real["fp16/auto"] == [True, 2, []]


@pytest.mark.parametrize("version", list(WHEELS))
def test_without_cuda_tensorrt_returns_null_and_edgecap_says_why(probed, version: str) -> None:
    answer = probed[version]
    assert answer["Builder"] == answer["Runtime"] == NULL_FACTORY  # what the fake raises for Faults(cuda=False)
    for kind in ("Builder", "Runtime"):
        message = answer[f"start {kind}"]
        assert message.startswith(f"TensorRT {SURFACES[version]['version']} could not start: CUDA could not be")
        assert "nvidia-smi" in message and "edgecap[tensorrt-cu12]" in message


@pytest.mark.parametrize("version", list(WHEELS))
def test_edgecaps_dtype_table_is_nptype_where_it_has_one(probed, version: str) -> None:
    assert probed[version]["numpy"] == SURFACES[version]["nptype"]


# -- edgecap's source against the recorded signatures ----------------------------------------------------------------
def _trt_chain(node: ast.AST) -> list[str] | None:
    """``["A", "B"]`` for ``trt.A.B`` (None for anything not rooted at the name ``trt``)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return list(reversed(parts)) if isinstance(node, ast.Name) and node.id == "trt" and parts else None


def _fits(call: ast.Call, signature: str) -> bool:
    params = overload_params(signature)
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return True  # *args/**kwargs: not checkable here
    names = [name for name, _ in params]
    keywords = {k.arg for k in call.keywords}
    if len(call.args) > len(params) or not keywords <= set(names[len(call.args) :]):
        return False
    return all(has_default or name in keywords for name, has_default in params[len(call.args) :])


def _calls() -> list[tuple[str, ast.Call]]:
    out = []
    for relpath in TRT_MODULES:
        tree = ast.parse((ROOT / relpath).read_text(), relpath)
        out += [(f"{relpath}:{n.lineno}", n) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    return out


def test_every_name_edgecap_takes_from_tensorrt_exists_in_every_version() -> None:
    missing, seen = [], set()
    for relpath in TRT_MODULES:
        for node in ast.walk(ast.parse((ROOT / relpath).read_text(), relpath)):
            chain = _trt_chain(node) if isinstance(node, ast.Attribute) else None
            if not chain or (isinstance(getattr(node, "ctx", None), ast.Load) and tuple(chain) in seen):
                continue
            seen.add(tuple(chain))
            for version, surface in SURFACES.items():
                top = chain[0]
                enum = surface["enums"].get(top)
                cls = surface["classes"].get(top)
                if top == "__version__" or top in surface["dtype_aliases"] or top == "nptype":
                    continue
                if enum is None and cls is None:
                    missing.append(f"{relpath}: trt.{top} ({version})")
                elif len(chain) > 1 and not (
                    (enum or {}).get(chain[1]) is not None or (cls or {}).get("members", {}).get(chain[1])
                ):
                    missing.append(f"{relpath}: trt.{'.'.join(chain[:2])} ({version})")
    assert seen, "no trt.X attribute found: the module list is stale"
    assert not missing, missing


def test_every_tensorrt_call_edgecap_makes_fits_a_real_overload() -> None:
    methods: dict[str, set[str]] = {}  # method -> every recorded overload of that name, any class or version
    for surface in SURFACES.values():
        for name, cls in surface["classes"].items():
            for member, recorded in (cls or {"members": {}})["members"].items():
                if recorded and recorded["kind"] == "method":
                    key = name if member == "__init__" else member
                    methods.setdefault(key, set()).update(recorded["overloads"])
    checked, wrong = 0, []
    for where, call in _calls():
        func = call.func
        if not isinstance(func, ast.Attribute):
            continue
        chain = _trt_chain(func)
        name = chain[0] if chain and len(chain) == 1 else func.attr  # trt.Builder(...) is Builder.__init__
        if name.startswith("_") or name not in methods or (chain and len(chain) > 1):
            continue
        checked += 1
        if not any(_fits(call, sig) for sig in methods[name]):
            wrong.append(f"{where}: {ast.unparse(call)} fits none of {sorted(methods[name])}")
    assert checked >= 20, f"only {checked} TensorRT calls found: the module list or the surface is stale"
    assert not wrong, wrong
