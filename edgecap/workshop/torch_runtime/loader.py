"""The torch runtime's bundle loader: a bundle's ``weights.safetensors`` decoded in torch (eager, static caches,
CUDA graphs or ``torch.compile``), or re-running the whole prefix each step (the ``torch-rerun`` baseline)."""

from __future__ import annotations

import torch

from edgecap.runtime.backends.registry import CaptionerError, LoadedRuntime, LoadRequest
from edgecap.runtime.bundle import Bundle
from edgecap.runtime.decoding.mask_predict import RefineModel
from edgecap.runtime.decoding.protocol import StepModel
from edgecap.runtime.images.inputs import image_inputs
from edgecap.workshop.runs import load_bundle_model
from edgecap.workshop.torch_runtime.prefix import PrefixRerunStepModel
from edgecap.workshop.torch_runtime.refine import TorchRefineModel
from edgecap.workshop.torch_runtime.runtime import TorchStepModel, resolve_device
from edgecap.workshop.torch_runtime.static_cache import StepModeError

__all__ = ["load_bundle_rerun_runtime", "load_bundle_runtime"]


def load_bundle_runtime(bundle: Bundle, request: LoadRequest, *, rerun_prefix: bool = False) -> LoadedRuntime:
    """A bundle's ``weights.safetensors`` in torch eager, for ``Captioner.load(runtime="torch")``.

    Precision ``"auto"``: FP16 on CUDA (autoregressive models; autocast over FP32 weights), else FP32. The backbone
    runs in torch too (the captioner weights alone take features). ``request.threads`` is not applied: torch's thread
    count is process-wide, and loading a captioner never changes process-wide settings.

    Args:
        bundle: an opened :class:`~edgecap.runtime.bundle.Bundle`.
        request: :class:`~edgecap.runtime.backends.registry.LoadRequest`.
        rerun_prefix: decode by re-running the whole prefix each step (the ``torch-rerun`` benchmark baseline).
    """
    if request.providers is not None:
        raise CaptionerError("providers= selects ONNX Runtime execution providers; the torch runtime has none")
    step_mode = getattr(request, "step_mode", "eager")
    dev = resolve_device(request.device or "auto")
    refine = bundle.decoding == "mask_predict"
    precision = request.precision
    if step_mode != "eager" and (refine or rerun_prefix):
        raise CaptionerError(
            f"step_mode={step_mode!r} applies to cached autoregressive decoding; "
            f"{'mask-predict bundles' if refine else 'the torch-rerun baseline'} run step_mode='eager'"
        )
    if refine and (precision == "fp16" or rerun_prefix):
        raise CaptionerError(
            "the torch mask-predict adapter runs FP32 weights and has no prefix to re-run; FP16 LaBERT needs "
            "runtime='onnxruntime'"
        )
    if precision == "auto":
        precision, reason = (
            ("fp16", "torch on cuda (FP16 autocast)")
            if dev.type == "cuda" and not refine
            else ("fp32", f"torch on {dev.type}")
        )
    elif precision == "int8":
        raise CaptionerError("the torch runtime runs FP32/FP16 weights; INT8 graphs need runtime='onnxruntime'")
    elif precision == "fp16" and dev.type != "cuda":
        raise CaptionerError("FP16 with the torch runtime needs a CUDA device; use fp32 on CPU")
    else:
        reason = "requested"
    if request.verify:
        bundle.verify(bundle.used_files(weights=True))
    model = load_bundle_model(bundle, device=str(dev))
    # FP16 as autocast (FP32 weights, FP16 matmuls), not weights cast with .half(): on the GPU check (H200, the
    # quickstart acort-xsmall, beam 3) autocast kept 96 % of the FP32 captions, .half() 91 % (docs/gpu.md).
    autocast = torch.float16 if precision == "fp16" else None
    if refine:
        step_model: StepModel | RefineModel = TorchRefineModel(model, dev)
    elif rerun_prefix:
        step_model = PrefixRerunStepModel(model, dev, autocast=autocast)
    else:
        try:
            step_model = TorchStepModel(model, dev, autocast=autocast, step_mode=step_mode)
        except StepModeError as exc:
            raise CaptionerError(str(exc)) from None
    inputs, backbone, no_images = image_inputs(bundle, dev, in_graph=False)  # the adapter casts to fp16
    info = {"providers": None, "device": str(dev), "precision": precision, "precision_reason": reason}
    info["step_mode"] = getattr(step_model, "step_mode", "eager")
    info["backbone"] = backbone
    return LoadedRuntime(step_model, inputs, info, [], no_images)


def load_bundle_rerun_runtime(bundle: Bundle, request: LoadRequest) -> LoadedRuntime:
    """:func:`load_bundle_runtime` decoding by re-running the prefix (``runtime="torch-rerun"``, a baseline)."""
    return load_bundle_runtime(bundle, request, rerun_prefix=True)
