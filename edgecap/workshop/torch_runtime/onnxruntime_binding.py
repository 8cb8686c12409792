"""ONNX Runtime's io-binding path with torch tensors: inputs bound by device pointer, outputs wrapped zero-copy.

With the CUDA/TensorRT providers a session binds torch tensors by device pointer and ONNX Runtime allocates the
outputs on the device; they come back as torch tensors without leaving it (DLPack, else the CUDA Array Interface),
so a decode loop's caches never cross PCIe (:mod:`edgecap.runtime.backends.onnxruntime.arrays` says why this path
exists). The same path runs on CPU, which is how the tests exercise it. The runtime half reaches it through
:func:`edgecap.runtime.torch_hooks.torch_hook` (``"onnxruntime_binding"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from edgecap.runtime.backends.base import Array
from edgecap.runtime.backends.onnxruntime.arrays import ONNXRUNTIME_TYPES, cuda_array_interface

__all__ = ["run_bound", "to_torch", "torch_numpy_dtype"]


def to_torch(value: Any, device: Any) -> Any:
    """An output OrtValue as a torch tensor, without leaving the device where the API allows:

    - DLPack (``OrtValue.__dlpack__``, in current releases): zero-copy;
    - else, for a CUDA output (onnxruntime builds whose OrtValue lacks DLPack, such as some 1.18–1.20 wheels Jetson
      users get): zero-copy through the CUDA Array Interface built from ``data_ptr()``/``shape()``/``data_type()``,
      which every release since 1.8 has; the wrapper holds the OrtValue, so ORT's buffer lives as long as the tensor;
    - else (a CPU output): through numpy.
    """
    if hasattr(value, "__dlpack__"):
        return torch.from_dlpack(value)
    if getattr(device, "type", None) == "cuda" and callable(getattr(value, "data_ptr", None)):
        shape = tuple(int(d) for d in value.shape())
        dtype = np.dtype(ONNXRUNTIME_TYPES[value.data_type()])
        if 0 in shape:  # an empty tensor may have no buffer at all
            return torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, device=device)
        return torch.as_tensor(_CudaArray(value, shape, dtype), device=device)
    return torch.from_numpy(value.numpy()).to(device)


class _CudaArray:
    """An ORT-owned CUDA buffer as a CUDA Array Interface (v2) object; keeps the OrtValue alive."""

    def __init__(self, value: Any, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.value = value
        self.__cuda_array_interface__ = cuda_array_interface(int(value.data_ptr()), shape, dtype)


def torch_numpy_dtype(torch_dtype: Any) -> Any:
    """The numpy scalar type of a torch dtype (what ``IOBinding.bind_input`` takes)."""
    if torch_dtype == torch.bool:
        return np.bool_
    return torch.empty((), dtype=torch_dtype).numpy().dtype.type


def run_bound(
    session: Any, binding: Any, feed: Mapping[str, Array], output_names: Sequence[str], device_type: str, device_id: int
) -> dict[str, Any]:
    """One ``run_with_iobinding`` call: ``feed`` (torch tensors or numpy arrays) bound by pointer on the device, the
    outputs allocated there by ONNX Runtime and returned as torch tensors (:func:`to_torch`, zero-copy)."""
    binding.clear_binding_inputs()
    binding.clear_binding_outputs()
    device = torch.device(device_type, device_id) if device_type == "cuda" else torch.device("cpu")
    keep_alive = []
    for name, value in feed.items():
        tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
        tensor = tensor.detach().to(device).contiguous()
        keep_alive.append(tensor)
        binding.bind_input(
            name, device_type, device_id, torch_numpy_dtype(tensor.dtype), tuple(tensor.shape), tensor.data_ptr()
        )
    for name in output_names:
        binding.bind_output(name, device_type, device_id)
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # inputs written by torch kernels must be complete
    session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    values = binding.get_outputs()
    return {name: to_torch(value, device) for name, value in zip(output_names, values, strict=True)}
