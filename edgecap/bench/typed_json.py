"""Report dataclasses to and from strict JSON: :func:`jsonable` writes, :func:`build` reads back a report that
``report.schema.json`` has already checked (presence and type of every field, errors naming the file and the JSON
path), so a hand-edited or truncated ``report.json`` fails naming the field instead of surfacing as an
``AttributeError`` in a table.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any

__all__ = ["ReportError", "build", "current_runtime_names", "jsonable"]


class ReportError(ValueError):
    """A report file that cannot be read: not JSON, a newer schema, or a missing/mistyped field (named)."""


def current_runtime_names(value: Any) -> Any:
    """``value`` with every ``runtime``/``runtimes`` entry under its current registry name, so a report written
    before a runtime was renamed (``ort`` -> ``onnxruntime``) compares with a new one."""
    from edgecap.runtime.backends.registry import canonical_runtime

    if isinstance(value, list):
        return [current_runtime_names(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: current_runtime_names(v) for k, v in value.items()}
    if isinstance(out.get("runtime"), str):
        out["runtime"] = canonical_runtime(out["runtime"])
    if isinstance(out.get("runtimes"), list):
        out["runtimes"] = [canonical_runtime(r) if isinstance(r, str) else r for r in out["runtimes"]]
    return out


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _convert(tp: Any, value: Any) -> Any:
    """``value`` (from JSON, already checked against the schema) as type ``tp``: dataclasses, optionals, lists,
    tuples, dicts, and floats from JSON integers."""
    if value is None or tp is Any:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return _convert(options[0], value) if len(options) == 1 else value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value)
    if origin is list:
        return [_convert(args[0] if args else Any, v) for v in value]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v) for v in value)
        return tuple(_convert(a, v) for a, v in zip(args, value, strict=True))
    if origin is dict:
        return {k: _convert(args[1] if args else Any, v) for k, v in value.items()}
    if tp is float:
        return float(value)
    return value


def build(cls: type, data: dict[str, Any]) -> Any:
    """The dataclass ``cls`` from ``data`` checked against the report schema (:mod:`edgecap.runtime.schema`), which
    says what each field may hold; fields it does not know are ignored, absent optional ones take their default."""
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _convert(hints[f.name], data[f.name]) for f in dataclasses.fields(cls) if f.name in data}
    return cls(**kwargs)
