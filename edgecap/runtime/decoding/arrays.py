"""Array conversions at the search's boundary: whatever a step model returns becomes a numpy array here, once.

The search runs on numpy so that an ONNX Runtime deployment never imports torch. Adapters may still return torch
tensors (training/eval code) or device arrays; :func:`to_numpy` recognises them by the module of their type, without
importing the library, and copies to the host only when the array is not there already.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import DTypeLike

__all__ = ["array_module", "to_numpy"]


def array_module(x: Any) -> str:
    """The top-level package of ``x``'s type (``"numpy"``, ``"torch"``, ``"cupy"`` …), read without importing it."""
    return type(x).__module__.partition(".")[0]


def to_numpy(x: Any, dtype: DTypeLike | None = None) -> np.ndarray:
    """``x`` as a numpy array (of ``dtype`` when given), zero-copy where the data already lives on the host.

    - numpy arrays pass through (cast only when ``dtype`` differs);
    - torch tensors: ``.detach()``, cast to float32 on their device first when ``dtype`` is float32 and they are
      floating (one small device-side cast instead of a host-side one), then ``.cpu().numpy()``;
    - cupy arrays: ``.get()``;
    - anything else through ``np.asarray`` (lists, scalars, objects with ``__array__``).

    The result may share memory with ``x``: callers must not write into it.
    """
    module = array_module(x)
    if module == "numpy" and type(x) is np.ndarray:
        out = x
    elif module == "torch" and hasattr(x, "detach"):
        tensor = x.detach()
        if dtype is not None and np.dtype(dtype) == np.float32 and tensor.is_floating_point():
            tensor = tensor.float()
        out = tensor.cpu().numpy()
    elif module == "cupy" and hasattr(x, "get"):
        out = x.get()
    else:
        out = np.asarray(x)
    if dtype is not None and out.dtype != dtype:
        out = out.astype(dtype)
    return out
