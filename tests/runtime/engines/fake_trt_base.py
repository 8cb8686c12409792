"""What the fake ``tensorrt`` (:mod:`tests.runtime.engines.fake_trt`) is made of: the recorded surfaces, pybind11-like
enums,
argument checks, the failures it can be told to have (:class:`Faults`) and ``trt.nptype``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.runtime.engines.trt_surface import load_snapshot

SURFACES = load_snapshot()
#: pybind11's message when a factory returns NULL, as the real bindings raise it without CUDA (checked there).
NULL_FACTORY = "pybind11::init(): factory function returned nullptr"
#: What the fake builder's plans say they are (the fake runtime deserialises nothing else).
PLAN_FORMAT = "edgecap-fake-trt-plan"
#: How a fake timing cache starts (then the TensorRT version, a newline, one ``+`` per build that timed into it).
TIMING_HEADER = b"fake-timing-cache "
#: ONNX element types -> TensorRT ``DataType`` member names.
ONNX_TYPES = {1: "FLOAT", 2: "UINT8", 3: "INT8", 6: "INT32", 7: "INT64", 9: "BOOL", 10: "HALF", 16: "BF16"}


@dataclass
class Faults:
    """How the fake fails, as real machines do.

    Attributes:
        cuda: False: ``Builder`` and ``Runtime`` raise pybind11's NULL-factory ``TypeError``.
        unsupported_ops: ONNX op types the parser reports as ``UNSUPPORTED_NODE``.
        no_context: ``create_execution_context`` returns None.
        refused_addresses: tensor names ``set_tensor_address`` returns False for.
        retype: per plan source (``step.onnx``, ``gather``), tensor -> ``DataType`` member name the engine reports.
    """

    cuda: bool = True
    unsupported_ops: frozenset[str] = frozenset()
    no_context: bool = False
    refused_addresses: frozenset[str] = frozenset()
    retype: dict[str, dict[str, str]] = field(default_factory=dict)


class FakeEnum:
    """A pybind11 enum member: ``int()``-able, equal and hashed by value within its enum only, unordered."""

    __members__: dict[str, FakeEnum]
    _by_value: dict[int, FakeEnum]
    name: str
    value: int

    def __new__(cls, value: int) -> FakeEnum:
        try:
            return cls._by_value[int(value)]
        except KeyError:
            raise ValueError(f"{value} is not a valid {cls.__name__}") from None

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.value == self.value  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value}>"

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


def make_enum(name: str, members: dict[str, int]) -> type[FakeEnum]:
    """An enum class with ``members`` (aliases of one value share the first member's object)."""
    cls = type(name, (FakeEnum,), {"__members__": {}, "_by_value": {}, "__module__": "tensorrt"})
    for member, value in members.items():
        obj = cls._by_value.get(value)
        if obj is None:
            obj = object.__new__(cls)
            obj.name, obj.value = member, value
            cls._by_value[value] = obj
        cls.__members__[member] = obj
        setattr(cls, member, obj)
    return cls


def check_type(value: Any, expected: type, what: str) -> None:
    """pybind11's refusal of an argument of the wrong type."""
    if not isinstance(value, expected):
        raise TypeError(f"{what}(): incompatible function arguments: expected {expected.__name__}, got {value!r}")


class _Bound:
    """A fake class bound to its module (``_trt``): its enums are that version's. Classes TensorRT never lets Python
    construct are made with :meth:`_make`, so their ``__init__`` is not part of the surface."""

    _trt: Any

    @classmethod
    def _make(cls, **attrs: Any) -> Any:
        obj = cls.__new__(cls)
        obj.__dict__.update(attrs)
        return obj


def nptype(trt_type: Any) -> type:
    """``trt.nptype``: the numpy type of a ``DataType``; TypeError for those without one (BF16, FP8, …)."""
    import numpy as np

    name = _NPTYPE.get(getattr(trt_type, "name", None)) if isinstance(trt_type, FakeEnum) else None
    if name is None:
        raise TypeError("Could not resolve TensorRT datatype to an equivalent numpy datatype.")
    return np.dtype(name).type


_NPTYPE: dict[str, str] = {}  # the record's nptype table, the same in every recorded version (asserted)
for _surface in SURFACES.values():
    for _member, _numpy in _surface["nptype"].items():
        if _numpy is not None:
            assert _NPTYPE.setdefault(_member, _numpy) == _numpy
