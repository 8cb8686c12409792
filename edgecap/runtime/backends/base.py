"""``Runtime``: one inference graph on one backend, modelled on Polygraphy's ``BaseRunner``.

The public methods own the invariants — activation state, feed checking, latency timing — and a backend implements
only ``_activate``, ``_input_metadata``, ``_infer`` and ``_close``. Nothing heavy is imported here and nothing is
allocated before ``__enter__``, so ``import edgecap`` works without onnxruntime or TensorRT.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

#: A backend array: ``numpy.ndarray``, ``torch.Tensor`` or a backend's own device array; it has ``shape`` and
#: ``dtype``.
Array = Any

Dim = int | str | None


#: The leading dimension of a step graph's *image states* (``CaptionModel.image_state_names``): one row per image,
#: each serving its consecutive hypotheses; the other inputs' leading dimension is ``batch`` (one row per hypothesis).
IMAGE_DIM = "images"


class RuntimeInputError(ValueError):
    """A feed does not match the runtime's inputs (names, dtypes, ranks or fixed dimensions)."""


class RuntimeStateError(RuntimeError):
    """A runtime was used while inactive (outside ``with runtime:`` / before ``activate()``)."""


def dtype_name(dtype: Any) -> str:
    """Backend-neutral dtype name: ``"float32"``, ``"int64"``, ``"bool"`` … for torch, numpy or string dtypes."""
    if isinstance(dtype, str):
        return dtype.removeprefix("torch.")
    text = str(dtype)
    if text.startswith("torch."):
        return text.removeprefix("torch.")
    import numpy as np

    return np.dtype(dtype).name


@dataclass(frozen=True)
class TensorMeta:
    """Name, dtype and shape of a graph input; a ``None`` or string dimension is dynamic (e.g. ``"batch"``)."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]

    @property
    def dynamic_dims(self) -> tuple[str, ...]:
        """The named dynamic dimensions (the export spec's ``batch``, ``past`` …), in shape order."""
        return tuple(d for d in self.shape if isinstance(d, str))

    @classmethod
    def of(cls, name: str, dtype: Any, shape: Sequence[Dim]) -> TensorMeta:
        return cls(name, dtype_name(dtype), tuple(shape))

    def check(self, value: Array, runtime: str) -> None:
        """Raise :class:`RuntimeInputError` naming the input when ``value`` does not fit."""
        shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
        if shape is None or dtype is None:
            raise RuntimeInputError(f"{runtime}: input {self.name!r} must be an array, got {type(value).__name__}")
        got = dtype_name(dtype)
        if got != self.dtype:
            raise RuntimeInputError(f"{runtime}: input {self.name!r} has dtype {got}, expected {self.dtype}")
        if len(shape) != len(self.shape):
            raise RuntimeInputError(
                f"{runtime}: input {self.name!r} has rank {len(shape)} (shape {tuple(shape)}), "
                f"expected rank {len(self.shape)} {self.shape}"
            )
        for axis, (have, want) in enumerate(zip(shape, self.shape, strict=True)):
            if isinstance(want, int) and int(have) != want:
                raise RuntimeInputError(
                    f"{runtime}: input {self.name!r} has size {int(have)} on axis {axis}, expected {want} "
                    f"(shape {tuple(shape)} vs {self.shape})"
                )


class Runtime(ABC):
    """Base class of every backend runtime: a context manager around one inference graph.

    Usage::

        with SomeRuntime(...) as rt:
            meta = rt.input_metadata()
            outputs = rt.infer({"tokens": tokens, ...})
            rt.last_latency_s

    Subclasses implement ``_activate`` (load/allocate), ``_input_metadata``, ``_infer`` (run; return every output by
    name; block until results are ready so latency is honest) and ``_close`` (release). ``array_type`` tells bridges
    which arrays ``_infer`` takes and returns (``"numpy"`` or ``"torch"``).
    """

    array_type: ClassVar[str] = "numpy"

    def __init__(self, name: str | None = None) -> None:
        self.name = name or type(self).__name__
        self.is_active = False
        self.inference_count = 0
        self._last_latency_s: float | None = None
        self._meta_cache: dict[str, TensorMeta] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def activate(self) -> None:
        """Load the graph and allocate resources; a no-op when already active."""
        if self.is_active:
            return
        self._activate()
        self.is_active = True

    def close(self) -> None:
        """Release resources; a no-op when inactive. The runtime may be activated again later."""
        if not self.is_active:
            return
        try:
            self._close()
        finally:
            self.is_active = False
            self._meta_cache = None

    def __enter__(self) -> Runtime:
        self.activate()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries -----------------------------------------------------------------------------------------------------
    def _require_active(self, what: str) -> None:
        if not self.is_active:
            raise RuntimeStateError(f"{self.name}: {what} needs an active runtime; use 'with runtime:' or activate()")

    def input_metadata(self) -> dict[str, TensorMeta]:
        """Every input the graph takes, by name, in graph order."""
        self._require_active("input_metadata()")
        if self._meta_cache is None:
            self._meta_cache = dict(self._input_metadata())
        return dict(self._meta_cache)

    @property
    def last_latency_s(self) -> float | None:
        """Wall-clock seconds of the most recent :meth:`infer` (backend call only, checks excluded)."""
        return self._last_latency_s

    # -- inference ---------------------------------------------------------------------------------------------------
    def infer(self, feed: Mapping[str, Array], check_inputs: bool = True) -> dict[str, Array]:
        """Run the graph once.

        Args:
            feed: one array per input name.
            check_inputs: verify names, dtypes, ranks and fixed dimensions first (cheap; disable only in hot loops
                whose feeds were checked once).

        Returns:
            Every output, by name.
        """
        if not self.is_active:
            self._require_active("infer()")
        if check_inputs:
            self.check_feed(feed)
        start = time.perf_counter()
        outputs = self._infer(feed)
        self._last_latency_s = time.perf_counter() - start
        self.inference_count += 1
        if not isinstance(outputs, dict):
            raise TypeError(f"{self.name}: _infer() must return a dict of outputs, got {type(outputs).__name__}")
        return outputs

    def check_feed(self, feed: Mapping[str, Array]) -> None:
        """Raise :class:`RuntimeInputError` unless ``feed`` matches :meth:`input_metadata` exactly."""
        meta = self.input_metadata()
        missing = [n for n in meta if n not in feed]
        unexpected = [n for n in feed if n not in meta]
        if missing or unexpected:
            raise RuntimeInputError(
                f"{self.name}: feed names do not match the graph inputs; missing {missing}, unexpected {unexpected} "
                f"(inputs: {list(meta)})"
            )
        for name, tensor_meta in meta.items():
            tensor_meta.check(feed[name], self.name)

    # -- backend hooks -----------------------------------------------------------------------------------------------
    @abstractmethod
    def _activate(self) -> None: ...

    @abstractmethod
    def _input_metadata(self) -> Mapping[str, TensorMeta]: ...

    @abstractmethod
    def _infer(self, feed: Mapping[str, Array]) -> dict[str, Array]: ...

    @abstractmethod
    def _close(self) -> None: ...

    def __repr__(self) -> str:
        state = "active" if self.is_active else "inactive"
        return f"{type(self).__name__}(name={self.name!r}, {state})"
