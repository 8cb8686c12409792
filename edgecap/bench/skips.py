"""Which runtime/precision combinations of a bundle cannot be measured here, and why (:func:`skip_reason`): not
failures, the report lists them under ``skipped``."""

from __future__ import annotations

from typing import Any

from edgecap.runtime.backends.registry import UnknownRuntimeError, get_runtime, list_runtimes

__all__ = ["skip_reason"]


def _torch_backbone_installed() -> bool:
    from edgecap.bench.environment import module_installed

    return module_installed("torch") and module_installed("timm")


def _cuda_requested(device: str | None) -> bool:
    return device is not None and device.startswith("cuda")


def skip_reason(runtime: str, precision: str, bundle: Any, device: str | None) -> str | None:
    """Why ``runtime`` at ``precision`` cannot be measured for ``bundle`` here, or None when it can.

    These are combinations that cannot exist here (not failures): the report lists them under ``skipped``. What a
    runtime runs and needs comes from the runtime registry, so a runtime whose backend is not installed (torch in a
    runtime-only install) is skipped with the registry's install hint instead of failing the run.
    """
    try:
        spec = get_runtime(runtime)
    except UnknownRuntimeError:
        return f"unknown runtime {runtime!r}; known: {list_runtimes()}"
    if precision not in bundle.precisions:
        return f"the bundle has no {precision} variant (it holds {', '.join(bundle.precisions)})"
    if precision not in spec.precisions:
        able = "/".join(n for n in list_runtimes() if precision in get_runtime(n).precisions)
        return f"{runtime} runs {'/'.join(spec.precisions)} weights; {precision} needs --runtime {able}"
    available, why = spec.available()
    if not available:
        return why
    if bundle.backbone_spec and not bundle.backbone_in_graph and not _torch_backbone_installed():
        return (
            f"the bundle runs its backbone ({bundle.backbone_spec.get('name')}) in torch, which is not installed here: "
            f"{get_runtime('torch').install or 'install torch and timm'}; a pixels-in export needs neither"
        )
    torch_runtime = spec.torch
    if bundle.decoding == "mask_predict":
        if spec.baseline:
            return f"{runtime} re-runs the prefix, an autoregressive baseline; a mask-predict bundle has no prefix"
        if torch_runtime and precision != "fp32":
            return "the torch mask-predict adapter runs FP32 weights; FP16 LaBERT graphs need --runtime onnxruntime"
    if torch_runtime:
        import torch

        cuda = _cuda_requested(device) or (device in (None, "auto") and torch.cuda.is_available())
        if cuda and not torch.cuda.is_available():
            return f"device {device} requested but CUDA is not available"
        if precision == "fp16" and not cuda:
            return "FP16 with torch needs a CUDA device (torch has no fast FP16 CPU kernels)"
    return None
