"""Decode state in torch tensors: the array operations of runtimes whose ``array_type`` is ``"torch"``.

ONNX Runtime's io-binding path on CUDA and the torch graph runtime keep the state in torch tensors on their device,
so a decode loop's caches never cross PCIe and the beam reorder is a device ``index_select``. The runtime half
reaches this through :func:`edgecap.runtime.torch_hooks.torch_hook` (``"torch_arrays"``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edgecap.runtime.backends.base import Array
from edgecap.runtime.backends.bridge import ArrayOps

__all__ = ["TORCH_OPS", "TorchOps"]


def _writable(array: np.ndarray) -> np.ndarray:
    """``array`` contiguous and writable (``torch.from_numpy`` warns on read-only memory)."""
    return array if array.flags.c_contiguous and array.flags.writeable else np.array(array, order="C")


class TorchOps(ArrayOps):
    """The search's numpy arrays as torch tensors on the runtime's device, and back."""

    def feed(self, value: Any, dtype: str) -> torch.Tensor:
        tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(_writable(np.asarray(value)))
        return tensor.to(getattr(torch, dtype))

    def adopt(self, array: Array) -> torch.Tensor:
        return array if isinstance(array, torch.Tensor) else torch.from_numpy(_writable(np.asarray(array)))

    def take(self, array: Array, index: np.ndarray) -> torch.Tensor:
        return array.index_select(0, torch.from_numpy(index).to(array.device))


TORCH_OPS = TorchOps()
