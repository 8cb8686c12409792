"""A stand-in for the ``tensorrt`` module, generated from the checked-in surface of a real TensorRT version.

:func:`fake_tensorrt` builds a module for ``10.3``, ``10.16`` or ``11.4`` (the versions ``trt_surface.json`` records,
read from NVIDIA's bindings by ``test_trt_conformance.py``): its enums are int-valued like pybind11's (``int()``,
``.name``, ``.value``, equal only to members of the same enum) with that version's member values; ``trt.float32`` and
the other ``DataType`` aliases, ``trt.nptype`` (which raises for BF16 as the real one does) and ``trt.Logger.WARNING``
come from the record; and every class carries only the members the record lists, with the parameter names of one of
the real overloads (:func:`check_fake` verifies both whenever a fake is made). A member the record lacks does not
exist here either, so edgecap code that calls it fails in the tests, not first on a GPU.

The build half (:mod:`tests.runtime.engines.fake_trt_build`) records and checks what it is asked: ``OnnxParser`` reads
the
graph's inputs and outputs with ``onnx`` and reports nodes it is told not to support as ``ParserError`` objects;
``build_serialized_network`` returns JSON naming the graph, io, flags, workspace and profile (an ``IHostMemory``), or
None where TensorRT fails (a precision builder flag on a strongly typed network, an input without a profile shape, a
profile whose min/opt/max disagree). The runtime half (:mod:`tests.runtime.engines.fake_trt_runtime`) deserialises that
plan and runs it on the simulated device. :class:`~tests.runtime.engines.fake_trt_base.Faults` makes it fail as a
machine
can: CUDA not starting (``Builder`` and ``Runtime`` raise pybind11's "factory function returned nullptr"), a
timing cache TensorRT cannot use, a context that cannot be created, an address refused, a tensor retyped.
"""

from __future__ import annotations

import importlib.machinery
import inspect
import types
from typing import Any

from tests.runtime.engines import fake_trt_build as _build
from tests.runtime.engines import fake_trt_runtime as _runtime
from tests.runtime.engines.fake_trt_base import (
    NULL_FACTORY,
    PLAN_FORMAT,
    SURFACES,
    TIMING_HEADER,
    FakeEnum,
    Faults,
    make_enum,
    nptype,
)
from tests.runtime.engines.trt_surface import FUNCTIONS, USED, has_buffer_protocol, overload_params


def _classes() -> dict[str, type]:
    """Every fake class, by its TensorRT name."""
    b, r = _build, _runtime
    build = (b.Logger, b.Dims, b.ITensor, b.ILayer, b.IGatherLayer, b.INetworkDefinition, b.ParserError, b.OnnxParser,
             b.IHostMemory, b.ITimingCache, b.IOptimizationProfile, b.IBuilderConfig, b.Builder)  # fmt: skip
    return {cls.__name__: cls for cls in (*build, r.Runtime, r.ICudaEngine, r.IExecutionContext)}


def recorded_surface(version: str) -> str:
    """The recorded surface for ``version``: itself (``10.3``, ``10.16``, ``11.4``), or for a full release such as
    ``11.0.0.114`` the newest recorded one of that major not newer than it (else that major's oldest)."""
    if version in SURFACES:
        return version
    wanted = tuple(int(p) for p in version.split(".")[:2])
    same = sorted((tuple(map(int, k.split("."))), k) for k in SURFACES if int(k.split(".")[0]) == wanted[0])
    if not same:
        raise KeyError(f"no recorded TensorRT surface for {version} (recorded: {list(SURFACES)})")
    older = [key for parsed, key in same if parsed <= wanted]
    return older[-1] if older else same[0][1]


def fake_tensorrt(version: str = "10.3", *, faults: Faults | None = None, version_string: str | None = None) -> Any:
    """The stand-in ``tensorrt`` module of a recorded version (``10.3``, ``10.16``, ``11.4``).

    Args:
        version: a recorded version, or a full release (``"11.0.0.114"``: that ``__version__`` on the surface
            :func:`recorded_surface` picks).
        faults: how it fails (default: as a working GPU machine).
        version_string: ``__version__`` instead of the record's (another release of that API, e.g. 10.12.0.36).
    """
    key = recorded_surface(version)
    if key != version and version_string is None:
        version_string = version
    surface = SURFACES[key]
    module = types.ModuleType("tensorrt")
    module.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    module.__version__ = version_string or surface["version"]
    module._fake = faults or Faults()
    module._fake_log = []
    for name, members in surface["enums"].items():
        if members is None:
            continue
        owner, _, leaf = name.rpartition(".")
        enum = make_enum(leaf, members)
        if owner:
            setattr(module, owner, getattr(module, owner, None) or type(owner, (), {"__module__": "tensorrt"}))
            setattr(getattr(module, owner), leaf, enum)
        else:
            setattr(module, leaf, enum)
    for alias, member in surface["dtype_aliases"].items():
        setattr(module, alias, getattr(module.DataType, member))
    for name, cls in _classes().items():
        if surface["classes"].get(name) is not None:
            setattr(module, name, type(name, (cls,), {"_trt": module, "__module__": "tensorrt"}))
    for name, recorded in surface["classes"]["Logger"]["members"].items():
        if recorded and recorded["kind"] == "value":  # Logger.WARNING: set by the real package's __init__
            setattr(module.Logger, name, getattr(module.ILogger.Severity, name))
    module.nptype = nptype
    problems = check_fake(module, surface)
    if problems:
        raise AssertionError(f"the fake tensorrt {key} disagrees with trt_surface.json: {problems}")
    return module


def _own_members(cls: type) -> dict[str, Any]:
    """Members the fake defines (its Python classes), not those inherited from ``object``/``tuple``/``bytes``."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ in ("builtins",):
            continue
        out.update({k: v for k, v in vars(klass).items() if not k.startswith("_") or k in ("__init__", "__str__")})
    return out


def check_fake(module: Any, surface: dict[str, Any]) -> list[str]:
    """Where a fake module differs from a recorded surface: attributes the real module lacks, members of a class
    not recorded (or recorded as absent in that version), parameter lists matching no real overload, properties
    that are methods or settable where the real one is not, and enum values."""
    problems = []
    allowed = {*surface["enums"], *surface["dtype_aliases"], *FUNCTIONS, "ILogger"}
    allowed |= {n.split(".")[0] for n in surface["enums"]}
    allowed |= {n for n, c in surface["classes"].items() if c is not None}
    for name in vars(module):
        if not name.startswith("_") and name not in allowed:
            problems.append(f"tensorrt.{name} is not in the real module's recorded surface")
    for name, members in surface["enums"].items():
        owner = module
        for part in name.split("."):
            owner = getattr(owner, part, None)
        got = None if owner is None else {k: int(v) for k, v in owner.__members__.items()}
        if got != members:
            problems.append(f"enum {name}: {got} != {members}")
    for name, record in surface["classes"].items():
        cls = getattr(module, name, None)
        if record is None or cls is None:
            continue
        if has_buffer_protocol(cls) != record["buffer"]:
            problems.append(f"{name}: buffer protocol {has_buffer_protocol(cls)} here, {record['buffer']} in TensorRT")
        for member, value in _own_members(cls).items():
            problems += _member_problems(f"{name}.{member}", value, record["members"].get(member))
    return problems


def _member_problems(where: str, value: Any, recorded: dict[str, Any] | None) -> list[str]:
    if recorded is None:
        return [f"{where}: not a member of the real class (in this version)"]
    if isinstance(value, property):
        if recorded["kind"] != "property":
            return [f"{where}: a property here, a {recorded['kind']} in TensorRT"]
        if value.fset is not None and not recorded["settable"]:
            return [f"{where}: settable here, read-only in TensorRT"]
        return []
    if recorded["kind"] == "value":
        kind = type(value).__name__
        return [] if kind == recorded["type"] else [f"{where}: a {kind} here, a {recorded['type']} in TensorRT"]
    if recorded["kind"] != "method":
        return [f"{where}: a method here, a {recorded['kind']} in TensorRT"]
    try:
        params = [(p.name, p.default is not p.empty) for p in list(inspect.signature(value).parameters.values())[1:]]
    except (TypeError, ValueError):  # a builtin slot (tuple.__len__): nothing to compare
        return []
    overloads = [overload_params(sig) for sig in recorded["overloads"]]
    if params not in overloads:
        return [f"{where}{params} matches none of TensorRT's overloads {recorded['overloads']}"]
    return []


__all__ = ["NULL_FACTORY", "PLAN_FORMAT", "SURFACES", "TIMING_HEADER", "USED", "FakeEnum", "Faults", "check_fake",
           "fake_tensorrt", "nptype", "recorded_surface"]  # fmt: skip
