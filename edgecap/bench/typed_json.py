"""Report dataclasses to and from strict JSON: :func:`jsonable` writes, :func:`build` reads back checking every
field's presence and type against the annotations, so a hand-edited or truncated ``report.json`` fails naming the
field instead of surfacing as an ``AttributeError`` in a table.
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


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, where: str) -> Any:
    """``value`` (from JSON) as type ``tp``: dataclasses, optionals, lists, tuples, dicts and scalars."""
    if tp is Any:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise ReportError(f"{where}: must not be null")
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(option, value, where)
            except ReportError as exc:
                errors.append(str(exc))
        raise ReportError(errors[0] if len(errors) == 1 else f"{where}: matches none of {args} ({errors})")
    if dataclasses.is_dataclass(tp):
        return build(tp, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ReportError(f"{where}: expected a list, got {type(value).__name__}")
        return [_convert(args[0] if args else Any, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ReportError(f"{where}: expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ReportError(f"{where}: expected {len(args)} values, got {len(value)}")
        return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ReportError(f"{where}: expected an object, got {type(value).__name__}")
        return {k: _convert(args[1] if args else Any, v, f"{where}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ReportError(f"{where}: expected a number, got {type(value).__name__}")
        return float(value)
    if tp in (int, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ReportError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__}")
        return value
    raise ReportError(f"{where}: unsupported field type {_type_name(tp)}")


def build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ReportError(f"{where}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ReportError(f"{where}: field {f.name!r} is missing")
            continue
        kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}.{f.name}")
    return cls(**kwargs)
