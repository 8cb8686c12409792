"""The part of TensorRT's Python API that edgecap and its test fake use, read from a ``tensorrt`` module.

:func:`extract` records, for one module: its version; every member value of the enums edgecap reads; which module
attributes are ``DataType`` aliases (``trt.float32``); what ``trt.nptype`` gives for each ``DataType``; and for each
class in :data:`USED` its bases, whether it has the buffer protocol (``bytes(plan)``), and for each used member either
its kind and the parameter lists parsed from pybind11's docstrings (``name(self: ..., arg: type = default) -> ret``,
one per overload) or ``None`` when that version lacks it. ``trt_surface.json`` holds one record per version (key
``10.3``, ``10.16``, ``11.4``); ``tests/runtime/engines/test_trt_conformance.py`` re-extracts from NVIDIA's real
bindings and
compares, and ``tests/runtime/engines/fake_trt.py`` builds its stand-in from the record. Regenerate after changing
:data:`USED` (or the versions in ``real_trt.WHEELS``)::

    python -m tests.runtime.engines.trt_surface --write

Only the standard library is imported here: the function runs inside the subprocess that imports the real bindings.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).with_name("trt_surface.json")

# : Per class, the members edgecap (``edgecap/runtime/engines/build.py``, ``settings.py``,
# ``edgecap/runtime/backends/tensorrt/runtime*.py``)
#: or the fake use. A call edgecap makes outside this list fails in the fake (it has nothing else).
USED: dict[str, tuple[str, ...]] = {
    "Logger": ("__init__", "WARNING"),
    "Builder": ("__init__", "create_network", "create_builder_config", "create_optimization_profile",
                "build_serialized_network"),
    "INetworkDefinition": ("add_input", "add_gather", "mark_output"),
    "ILayer": ("get_output",),
    "IGatherLayer": ("get_output",),
    "ITensor": ("name",),
    "Dims": ("__init__", "__len__", "__getitem__"),
    "OnnxParser": ("__init__", "parse_from_file", "num_errors", "get_error"),
    "ParserError": ("code", "desc", "file", "func", "line", "node", "node_name", "node_operator", "__str__"),
    "IBuilderConfig": ("set_memory_pool_limit", "set_flag", "create_timing_cache", "set_timing_cache",
                       "get_timing_cache", "add_optimization_profile"),
    "IOptimizationProfile": ("set_shape",),
    "ITimingCache": ("serialize",),
    "IHostMemory": ("nbytes", "dtype"),
    "Runtime": ("__init__", "deserialize_cuda_engine"),
    "ICudaEngine": ("num_io_tensors", "get_tensor_name", "get_tensor_mode", "get_tensor_dtype", "get_tensor_shape",
                    "get_tensor_profile_shape", "create_execution_context"),
    "IExecutionContext": ("set_input_shape", "get_tensor_shape", "set_tensor_address", "execute_async_v3"),
}  # fmt: skip
#: Enums whose member values are recorded (a dotted name is a nested enum).
ENUMS = ("DataType", "NetworkDefinitionCreationFlag", "BuilderFlag", "MemoryPoolType", "TensorIOMode",
         "ILogger.Severity", "ErrorCode", "ExecutionContextAllocationStrategy")  # fmt: skip
#: Module-level functions recorded by behaviour (their docstrings carry no signature: they are Python code).
FUNCTIONS = ("nptype",)
_BASES_SKIPPED = {"object", "pybind11_object", "tuple", "bytes"}
_TYPE_REWRITES = (
    (re.compile(r"\btensorrt(?:_bindings)?\.tensorrt\."), ""),
    (re.compile(r"\btyping\.SupportsInt\b"), "int"),
    (re.compile(r"\btyping\.SupportsFloat\b"), "float"),
    (re.compile(r"\btyping_extensions\.Buffer\b"), "buffer"),
    (re.compile(r"\bcollections\.abc\.Sequence\b"), "Sequence"),
    (re.compile(r"\bList\["), "list["),
    (re.compile(r"\bnvonnxparser::IParserError\b"), "ParserError"),
)


def normalise_type(text: str) -> str:
    """A docstring type without its module prefix, spelled alike across pybind11 versions (``typing.SupportsInt``
    and ``int``, ``typing_extensions.Buffer`` and ``buffer``, ``List[x]`` and ``list[x]``)."""
    for pattern, replacement in _TYPE_REWRITES:
        text = pattern.sub(replacement, text)
    return text.strip()


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets (defaults such as ``<Severity.WARNING: 2>`` included)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "([<{":
            depth += 1
        elif char in ")]>}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    tail = text[start:]
    return [p.strip() for p in (*parts, tail) if p.strip()]


def parse_signatures(name: str, doc: str | None) -> list[str]:
    """Every overload pybind11 wrote into ``doc`` for ``name``, as ``"(arg: type, opt: type = ...) -> ret"`` with the
    types normalised and ``self`` left out. A generic ``(*args, **kwargs)`` header (overloaded functions) is skipped."""
    out = []
    line = re.compile(rf"^(?:\d+\.\s+)?{re.escape(name)}\((.*)\)\s*->\s*(.+)$")
    for text in (doc or "").splitlines():
        match = line.match(text.strip())
        if match is None:
            continue
        params: list[str] | None = []
        for part in _split_top(match.group(1)):
            if part.startswith("*"):
                params = None
                break
            head, _, default = part.partition(" = ")
            pname, _, ptype = head.partition(":")
            params.append(f"{pname.strip()}: {normalise_type(ptype)}" + (" = ..." if default else ""))
        if params is None:
            continue
        if params and params[0].split(":")[0] in ("self", "arg0"):
            params = params[1:]
        out.append(f"({', '.join(params)}) -> {normalise_type(match.group(2))}")
    return out


def overload_params(signature: str) -> list[tuple[str, bool]]:
    """``(name, has_default)`` per parameter of one recorded overload."""
    inner = signature[1 : signature.rindex(") ->")]
    return [(p.split(":")[0].strip(), p.endswith("= ...")) for p in _split_top(inner)]


def _property_type(prop: property) -> str:
    match = re.search(r"->\s*(.+)$", (prop.fget.__doc__ or "").strip().splitlines()[0]) if prop.fget.__doc__ else None
    return normalise_type(match.group(1)) if match else ""


def has_buffer_protocol(cls: type) -> bool:
    """Whether instances of ``cls`` export the buffer protocol (what ``bytes(plan)`` needs): ``__buffer__`` on Python
    3.12 and later; before, the ``bf_getbuffer`` of CPython's ``tp_as_buffer`` (the 21st pointer of the type object;
    a class made by ``type()`` has the table with nothing in it)."""
    if sys.version_info >= (3, 12) or hasattr(cls, "__buffer__"):
        return hasattr(cls, "__buffer__")
    import ctypes

    procs = ctypes.c_void_p.from_address(id(cls) + 20 * ctypes.sizeof(ctypes.c_void_p)).value
    return bool(procs and ctypes.c_void_p.from_address(procs).value)


def describe_member(cls: type, name: str) -> dict[str, Any] | None:
    """One member of a class: ``{"kind": "property", "type", "settable"}``, ``{"kind": "method", "overloads"}``,
    ``{"kind": "value", "type"}`` (``Logger.WARNING``), or None when the class lacks it."""
    raw = None
    for klass in cls.__mro__:
        if name in vars(klass):
            raw = vars(klass)[name]
            break
    if raw is None:
        return None
    if isinstance(raw, property):
        return {"kind": "property", "type": _property_type(raw), "settable": raw.fset is not None}
    if not callable(raw):
        return {"kind": "value", "type": type(raw).__name__}
    return {"kind": "method", "overloads": parse_signatures(name, getattr(raw, "__doc__", None))}


def _resolve(trt: Any, dotted: str) -> Any:
    value = trt
    for part in dotted.split("."):
        value = getattr(value, part, None)
    return value


def extract(trt: Any) -> dict[str, Any]:
    """The surface of ``trt`` that edgecap uses (see the module docstring)."""
    enums = {}
    for name in ENUMS:
        enum = _resolve(trt, name)
        enums[name] = None if enum is None else {k: int(v) for k, v in enum.__members__.items()}
    data_type = trt.DataType
    aliases = {a: getattr(trt, a).name for a in sorted(dir(trt)) if isinstance(getattr(trt, a), data_type)}
    nptype = {}
    for member_name, member in data_type.__members__.items():
        try:
            nptype[member_name] = __import__("numpy").dtype(trt.nptype(member)).name
        except TypeError:
            nptype[member_name] = None
    classes = {}
    for cls_name, members in USED.items():
        cls = getattr(trt, cls_name, None)
        if cls is None:
            classes[cls_name] = None
            continue
        classes[cls_name] = {
            "bases": [b.__name__ for b in cls.__mro__[1:] if b.__name__ not in _BASES_SKIPPED],
            "buffer": has_buffer_protocol(cls),
            "members": {m: describe_member(cls, m) for m in members},
        }
    return {"version": str(trt.__version__), "enums": enums, "dtype_aliases": aliases, "nptype": nptype,
            "classes": classes}  # fmt: skip


def load_snapshot() -> dict[str, dict[str, Any]]:
    """The checked-in surfaces, per short version."""
    return json.loads(SNAPSHOT.read_text())


def dump(surfaces: dict[str, dict[str, Any]]) -> str:
    """The snapshot's text (sorted keys, so a regenerated file differs only where TensorRT does)."""
    return json.dumps(surfaces, indent=1, sort_keys=True) + "\n"


def _write() -> None:  # pragma: no cover - a maintenance command
    import tempfile

    from tests.runtime.engines.real_trt import WHEELS, prepare, run_real

    root = Path(os.environ["EDGECAP_TEST_CACHE"]) if os.environ.get("EDGECAP_TEST_CACHE") else None
    root = root / "trt-bindings" if root else Path(tempfile.mkdtemp(prefix="edgecap-trt-"))
    surfaces = {}
    for version in WHEELS:
        real = prepare(version, root)
        done = run_real(real, _EXTRACT)
        if done.returncode != 0:
            raise SystemExit(done.stderr)
        surfaces[version] = json.loads(done.stdout)
    SNAPSHOT.write_text(dump(surfaces))
    print(f"wrote {SNAPSHOT} ({', '.join(surfaces)})")


#: The subprocess program: the real module's surface as JSON on stdout.
_EXTRACT = (
    "import json, tensorrt_bindings as t; from tests.runtime.engines.trt_surface import extract; "
    "print(json.dumps(extract(t)))"
)

if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python -m tests.runtime.engines.trt_surface --write")
    _write()
