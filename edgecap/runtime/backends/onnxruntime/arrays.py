"""Arrays between numpy, torch and ONNX Runtime's ``OrtValue``, and what a session's options and inputs say.

Helpers of :class:`~edgecap.runtime.backends.onnxruntime.session.OnnxRuntimeSession`: dtype names of ONNX tensor types,
outputs
of
the CUDA Array Interface of a device buffer, the fast feed check's fixed sizes, and a ``SessionOptions``' threading
read back. No torch: the io-binding path's torch side is
:mod:`edgecap.workshop.torch_runtime.onnxruntime_binding`, reached through :mod:`edgecap.runtime.torch_hooks`.

I/O: two paths behind one interface.

- ``io_binding=False`` (the default on CPU): numpy in, numpy out through ``session.run``. On CPU this is the
  faster path: ONNX Runtime wraps numpy inputs without a copy and hands its output buffers over as numpy arrays, while
  binding adds per-call bind/clear calls and DLPack wrapping (acort-xsmall beam-3 decode, 1 thread: 15.6 ms/image
  plain vs 17.4 ms/image bound). Only public onnxruntime API is used (``InferenceSession.run``,
  ``run_with_iobinding``, ``OrtValue``): bypassing ``run``'s Python wrapper saves a few µs per call, inside the
  run-to-run spread of a decode (``research/decode_overhead.py``).
- ``io_binding=True`` (the default when the CUDA/TensorRT providers run): torch tensors in and out, bound by device
  pointer; outputs are allocated by ONNX Runtime on the device and returned zero-copy through DLPack, so a decode loop's
  cache never crosses PCIe and beam reordering is a device ``index_select`` (``array_type = "torch"``). The same
  code path runs on CPU, which is how the tests exercise it (no GPU in CI).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from edgecap.runtime.backends.base import Array

__all__ = [
    "ONNXRUNTIME_TYPES",
    "as_numpy",
    "cuda_array_interface",
    "dim_of",
    "fast_checks",
    "fixed_sizes",
    "numpy_dtype_or_none",
    "passes_fast_checks",
    "read_settings",
]


# ONNX tensor type strings (``NodeArg.type``) -> numpy dtype names.
ONNXRUNTIME_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(bfloat16)": "bfloat16",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int16)": "int16",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}


def cuda_array_interface(pointer: int, shape: Sequence[int], dtype: Any) -> dict[str, Any]:
    """The CUDA Array Interface (version 2) of a C-contiguous device buffer: what ``torch.as_tensor`` reads to wrap
    device memory it does not own (no stream field: the caller synchronised the producer)."""
    dtype = np.dtype(dtype)
    return {"shape": tuple(int(d) for d in shape), "typestr": dtype.str, "data": (int(pointer), False), "version": 2}


def read_settings(options: Any) -> dict[str, Any]:
    """The threading a ``SessionOptions`` carries, read back from it (not from what was asked): intra/inter-op
    threads (0 = ONNX Runtime's default), execution mode, and the spinning entries (None = not set: it spins)."""
    from edgecap.runtime.backends.threads import SPIN_KEYS

    settings: dict[str, Any] = {
        "intra_op_threads": int(options.intra_op_num_threads),
        "inter_op_threads": int(options.inter_op_num_threads),
        "execution_mode": "parallel" if "PARALLEL" in str(options.execution_mode) else "sequential",
    }
    for key in SPIN_KEYS:
        try:
            settings[key] = options.get_session_config_entry(key)
        except Exception:  # onnxruntime raises a plain RuntimeError/Fail for an entry that was never set
            settings[key] = None
    return settings


def numpy_dtype_or_none(name: str) -> np.dtype | None:
    """The numpy dtype of a dtype name, or None for one numpy lacks."""
    try:
        return np.dtype(name)
    except TypeError:  # e.g. bfloat16: no numpy dtype, always take the full check
        return None


def fixed_sizes(shape: tuple[Any, ...]) -> tuple[Any, Any]:
    """(getter, sizes) of the fixed (integer) dimensions of a declared shape: ``getter(actual_shape) == sizes``
    exactly when every fixed dimension matches (the rank is checked first); ``(None, None)`` when none is fixed."""
    axes = [axis for axis, size in enumerate(shape) if isinstance(size, int)]
    if not axes:
        return None, None
    getter = operator.itemgetter(*axes)
    return getter, getter(shape)


def fast_checks(inputs: Iterable[Any]) -> tuple[tuple[str, Any, Any, Any, int], ...] | None:
    """Per input (a :class:`~edgecap.runtime.backends.base.TensorMeta`): name, numpy dtype, :func:`fixed_sizes` and
    rank, for
    :func:`passes_fast_checks`; None when an input has no numpy dtype (bfloat16 always takes the full check)."""
    checks = tuple(
        (meta.name, numpy_dtype_or_none(meta.dtype), *fixed_sizes(meta.shape), len(meta.shape)) for meta in inputs
    )
    return checks if all(check[1] is not None for check in checks) else None


def passes_fast_checks(checks: tuple[tuple[str, Any, Any, Any, int], ...] | None, feed: Mapping[str, Any]) -> bool:
    """Whether ``feed`` is numpy arrays of the declared dtypes, ranks and fixed sizes, in a few comparisons (the
    generic check costs ~20 µs per input, a visible share of a 0.3 ms step); False sends it to the full check,
    which names what is wrong."""
    if checks is None or len(feed) != len(checks):
        return False
    get = feed.get
    for name, dtype, fixed_of, fixed, rank in checks:
        value = get(name)  # None (a missing name) fails the type test: the full check names it
        if type(value) is not np.ndarray or value.dtype != dtype or value.ndim != rank:
            return False
        if fixed_of is not None and fixed_of(value.shape) != fixed:
            return False
    return True


def dim_of(value: Any) -> int | str | None:
    """A ``NodeArg`` shape entry as edgecap's: a fixed size, a dimension name, or None (unnamed)."""
    return value if isinstance(value, (int, str)) else None


def as_numpy(value: Array) -> np.ndarray:
    """A feed value as numpy (a torch tensor through the host)."""
    if isinstance(value, np.ndarray):
        return value
    detach = getattr(value, "detach", None)
    if detach is not None:  # a torch tensor
        return detach().cpu().numpy()
    return np.asarray(value)
