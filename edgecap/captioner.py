"""The embedded API: images in, captions out, from a bundle or a trained run.

    from edgecap import Captioner
    cap = Captioner.load("acort-bundle")            # verified bundle; ONNX Runtime (CUDA/TensorRT when present)
    print(cap("photo.jpg"), cap.runtime_info)

    cap = Captioner.from_run("acort-xsmall")         # a run directory, or a model name trained earlier (torch)

``Captioner.load`` imports no training code: the bundle reader, ONNX Runtime, the shared decoding package and, for
bundles whose encoder takes backbone features, the backbone (rebuilt in torch from the bundle's spec).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "ort", "torch")
PRECISIONS = ("auto", "fp32", "fp16", "int8")


class BackboneMismatchError(ValueError):
    """The backbone available now is not the one the run's features were made with."""


class CaptionerError(ValueError):
    """A runtime/precision request a bundle or this machine cannot serve, or inputs a captioner cannot take."""


def backbone_from_spec(spec: dict[str, Any], weights: str | Path | None = None):
    """Rebuild the backbone a feature cache (and so a run) was made with, and prove it is the same one."""
    from edgecap.models.backbone import create_backbone

    if not spec:
        raise BackboneMismatchError(
            "the run records no backbone (it was trained on precomputed region features); "
            "captioning raw images needs a run trained on backbone features"
        )
    identity = spec.get("weights", {})
    source = identity.get("source")
    if weights is None and source == "file":
        raise BackboneMismatchError(
            f"the run's backbone used local weights {identity.get('file')!r}: pass that file (backbone_weights=...)"
        )
    if weights is None and source == "random":
        raise BackboneMismatchError(
            "the run's features came from a randomly initialised backbone, which cannot be rebuilt; "
            "extract features with pretrained or file weights to caption images"
        )
    backbone = create_backbone(
        spec["name"], pretrained=source == "packaged", weights=weights, image_size=int(spec["image_size"])
    )
    got = backbone.spec["weights"].get("sha256")
    if got != identity.get("sha256"):
        raise BackboneMismatchError(
            f"backbone weights differ from the ones the run was trained with (sha256 {got} != {identity.get('sha256')})"
        )
    return backbone


# -- images -> encoder inputs ----------------------------------------------------------------------------------------
class BackboneInputs:
    """Images -> ``features`` (B, N, C), ``boxes`` (B, N, 4), ``feature_mask`` (B, N) through a torch backbone."""

    def __init__(self, backbone: Any, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.backbone = backbone.to(self.device).eval()

    @torch.inference_mode()
    def __call__(self, images: Sequence[Any]) -> dict[str, torch.Tensor]:
        pixels = self.backbone.preprocess(list(images)).to(self.device)
        features, boxes = self.backbone(pixels)
        mask = torch.ones(features.shape[:2], dtype=torch.bool, device=self.device)
        return {"features": features, "boxes": boxes, "feature_mask": mask}


class PixelInputs:
    """Images -> ``pixel_values`` (B, 3, S, S) with the backbone's own preprocessing (PIL + numpy: resize, crop,
    normalise exactly as ``Backbone.preprocess``), for bundles whose encoder graph contains the backbone."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        from edgecap.data.preprocess import PreprocessCfg

        self.cfg = PreprocessCfg(
            image_size=int(spec["image_size"]),
            mean=tuple(float(v) for v in spec["mean"]),
            std=tuple(float(v) for v in spec["std"]),
            interpolation=str(spec["interpolation"]),
            crop_pct=float(spec["crop_pct"]),
            crop_mode=str(spec["crop_mode"]),
        )
        self.backbone = None

    def __call__(self, images: Sequence[Any]) -> dict[str, torch.Tensor]:
        import numpy as np

        return {"pixel_values": torch.from_numpy(np.stack([self.cfg(image) for image in images]))}


# -- runtime and precision choice ------------------------------------------------------------------------------------
def _ort_providers() -> list[str] | None:
    """``onnxruntime.get_available_providers()``, or None when onnxruntime is not installed."""
    try:
        import onnxruntime
    except ImportError:
        return None
    return list(onnxruntime.get_available_providers())


def _cpu_can_run_int8(variant: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether this CPU runs the INT8 variant's preset correctly: a preset built for VNNI (no ``reduce_range``) or for
    ARM (S8S8) saturates on a CPU without those instructions, and a TensorRT (S8S8 symmetric) graph likewise.
    ``cpu-avx2`` graphs are safe everywhere."""
    preset = str(variant.get("preset") or variant.get("target") or "")
    try:
        from edgecap.calibration.presets import detect_cpu_preset

        here = detect_cpu_preset()
    except ImportError:
        here = "cpu-avx2"
    if preset == here or preset == "cpu-avx2":
        return True, f"INT8 preset {preset} suits this CPU ({here})"
    return False, f"the INT8 variant was quantised for {preset}, this CPU needs {here}"


def _auto_precision(available: Sequence[str], provider: str, int8: Mapping[str, Any] | None) -> tuple[str, str]:
    """The best precision of a bundle for ONNX Runtime's first provider, with the reason."""
    if provider == "TensorrtExecutionProvider":
        if int8 is not None and int8.get("preset") == "tensorrt":
            return "int8", "TensorRT with an INT8 variant calibrated for TensorRT"
        if "fp16" in available:
            return "fp16", "TensorRT: FP16 graphs"
    elif provider == "CUDAExecutionProvider":
        if "fp16" in available:
            return "fp16", "CUDA: FP16 graphs"
    elif int8 is not None:
        ok, why = _cpu_can_run_int8(int8)
        if ok:
            return "int8", why
        return "fp32", why
    else:
        return "fp32", "CPU: FP32 (the bundle has no INT8 variant; FP16 is slower than FP32 on ONNX Runtime's CPU)"
    return "fp32", f"{provider}: FP32 (no better variant in the bundle)"


# -- the captioner ---------------------------------------------------------------------------------------------------
class Captioner:
    """Images -> encoder inputs -> a :class:`~edgecap.decoding.StepModel` -> captions; call it on one image or use
    :meth:`batch`.

    Args:
        inputs: images -> encoder inputs (:class:`BackboneInputs`, :class:`PixelInputs`), or None when captions can
            only come from precomputed features (:meth:`caption_inputs`); ``no_images_reason`` then says why.
        step_model: torch, ONNX Runtime or TensorRT adapter.
        vocab: decodes token ids to words.
        decode_cfg: how to decode.
        runtime_info: what was chosen and why (``Captioner.load`` fills it).
        resources: objects closed by :meth:`close` (runtime sessions).
        length_levels: ``((L_low, L_high), ...)`` of a length-controllable model, for clear range errors when the
            step model cannot tell (an ONNX ``*-len`` encoder); ``()`` = ask the step model.
    """

    def __init__(
        self,
        inputs: Any,
        step_model: Any,
        vocab: Any,
        decode_cfg: Any,
        *,
        runtime_info: dict[str, Any] | None = None,
        resources: Sequence[Any] = (),
        no_images_reason: str = "",
        length_levels: Sequence[Sequence[int]] = (),
    ) -> None:
        self.inputs = inputs
        self.step_model = step_model
        self.vocab = vocab
        self.decode_cfg = decode_cfg
        self.runtime_info: dict[str, Any] = dict(runtime_info or {})
        self._resources = list(resources)
        self._no_images_reason = no_images_reason
        self.length_levels = tuple((int(lo), int(hi)) for lo, hi in length_levels)

    @property
    def backbone(self) -> Any:
        """The torch backbone (None when it is inside the ONNX graph, or absent)."""
        return getattr(self.inputs, "backbone", None)

    # -- constructors ----------------------------------------------------------------------------------------------
    @classmethod
    def from_run(
        cls, run: str | Path, device: str = "cpu", beam: int = 3, backbone_weights: str | Path | None = None
    ) -> Captioner:
        """A captioner on the torch weights of a trained run (a run directory or a model name trained earlier)."""
        from edgecap.captioning import DEFAULT_LENGTH_LEVEL, decode_cfg_for, decoder_for
        from edgecap.runs import load_run

        trained = load_run(run, device=device)
        backbone = backbone_from_spec(trained.backbone_spec, weights=backbone_weights)
        overrides: dict[str, Any] = {}
        if hasattr(trained.model, "refine"):  # LaBERT: mask-predict (LaBERT §3.2)
            overrides = {"strategy": "mask_predict", "length_level": DEFAULT_LENGTH_LEVEL}
        elif getattr(trained.model, "length_levels", None):
            overrides = {"length_level": DEFAULT_LENGTH_LEVEL}
        cfg = decode_cfg_for(trained.vocab, beam_size=beam, max_words=trained.max_words, **overrides)
        info = {"runtime": "torch", "device": str(device), "precision": "fp32", "run": str(trained.path)}
        return cls(
            BackboneInputs(backbone, device), decoder_for(trained.model, device), trained.vocab, cfg,
            runtime_info=info,
        )  # fmt: skip

    @classmethod
    def load(
        cls,
        bundle: str | Path,
        runtime: str = "auto",
        precision: str = "auto",
        beam: int | None = None,
        threads: int | None = None,
        *,
        providers: Sequence[str] | str | None = None,
        device: str | None = None,
        verify: bool = True,
    ) -> Captioner:
        """Load a bundle (verified: checksums, versions, vocab, graph interface) on the best available runtime.

        Args:
            bundle: a bundle directory (``edgecap export``).
            runtime: ``"auto"`` (ONNX Runtime when installed, else torch), ``"ort"`` or ``"torch"`` (the bundle's
                ``weights.safetensors`` with the torch adapter).
            precision: ``"auto"`` (best for the runtime: INT8 on a CPU its preset suits, FP16 on CUDA/TensorRT,
                else FP32), or ``"fp32"``/``"fp16"``/``"int8"``.
            beam: beam size (1 = greedy); default the bundle's (3).
            threads: CPU threads for ONNX Runtime's ops and torch (default: the libraries' own).
            providers: ONNX Runtime providers in priority order (``"cuda"``, ``"tensorrt"``, ``"cpu"``); default
                TensorRT, CUDA when this onnxruntime build has them, then CPU.
            device: torch device for the torch runtime and the backbone; default CUDA when available.
            verify: check every file's SHA-256 (leave on; it reads each file once).

        The choice is in :attr:`runtime_info` and logged (logger ``edgecap.captioner``, level INFO).

        Raises:
            edgecap.bundle.BundleError: the bundle is corrupt, incomplete, inconsistent or too new.
            CaptionerError: a runtime/precision the bundle or this machine cannot serve.
        """
        from edgecap.bundle.reader import load_bundle

        if runtime not in RUNTIMES:
            raise CaptionerError(f"runtime must be one of {list(RUNTIMES)}, got {runtime!r}")
        if precision not in PRECISIONS:
            raise CaptionerError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
        if threads is not None and (not isinstance(threads, int) or threads < 0):
            raise CaptionerError(f"threads must be an integer >= 0, got {threads!r}")
        opened = load_bundle(bundle, verify=verify, graphs="none")
        available = _ort_providers()
        if runtime == "auto":
            runtime, runtime_reason = ("ort", "onnxruntime is installed") if available else (
                "torch", "onnxruntime is not installed: torch weights"
            )  # fmt: skip
        elif runtime == "ort" and available is None:
            raise CaptionerError("runtime='ort' needs onnxruntime: pip install 'edgecap[onnx]' (or runtime='torch')")
        else:
            runtime_reason = "requested"
        if threads:
            torch.set_num_threads(threads)
        beam = opened.beam if beam is None else int(beam)
        if beam < 1:
            raise CaptionerError(f"beam must be >= 1, got {beam}")
        builder = _load_ort if runtime == "ort" else _load_torch
        step_model, inputs, info, resources, no_images = builder(
            opened, precision, threads, providers, device, available or []
        )
        try:
            vocab = opened.load_vocab()
            cfg = bundle_decode_cfg(opened, vocab, beam)
        except BaseException:
            for resource in resources:
                resource.__exit__(None, None, None)
            raise
        info = {"runtime": runtime, "runtime_reason": runtime_reason, **info, "beam": beam}
        info.update(decoding=cfg.strategy, length_level=cfg.length_level)
        info.update(bundle=str(opened.path), model=opened.name)
        info["summary"] = _describe(info)
        log.info("Captioner.load(%s): %s", opened.path, info["summary"])
        return cls(
            inputs, step_model, vocab, cfg, runtime_info=info, resources=resources, no_images_reason=no_images,
            length_levels=opened.length_levels,
        )  # fmt: skip

    # -- captioning ------------------------------------------------------------------------------------------------
    def __call__(self, image: Any, length_level: int | None = None) -> str:
        """The caption of one image; ``length_level`` (1-based; LaBERT and ``*-len`` models) asks for a short
        (1) or a detailed (4, 4-level plan) caption. Without one, a length-controllable model decodes at the level
        in :attr:`decode_cfg` (for a bundle: the default recorded at export, ``DEFAULT_LENGTH_LEVEL`` = 2)."""
        return self.batch([image], length_level=length_level)[0]

    def batch(self, images: Sequence[Any], batch_size: int = 16, length_level: int | None = None) -> list[str]:
        """Captions for ``images`` (paths, PIL images or arrays), in order, at ``length_level`` when given."""
        if self.inputs is None:
            raise CaptionerError(self._no_images_reason or "this captioner cannot take images")
        if isinstance(images, (str, os.PathLike)):
            images = [images]
        out: list[str] = []
        for start in range(0, len(images), batch_size):
            batch = self.inputs(list(images[start : start + batch_size]))
            out.extend(self.caption_inputs(batch, length_level=length_level))
        return out

    def caption_inputs(self, inputs: Mapping[str, Any], length_level: int | None = None) -> list[str]:
        """Captions for one batch of precomputed encoder inputs (``features``/``boxes``/``feature_mask`` or
        ``pixel_values``, batch first), e.g. bottom-up region features."""
        from edgecap.captioning import captions_from_hypotheses
        from edgecap.decoding import decode

        cfg = self.decode_cfg
        if length_level is not None:
            _check_length_level(self.step_model, length_level, self.length_levels)
            cfg = cfg.replace(length_level=length_level)
        tensors = {k: v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for k, v in inputs.items()}
        with torch.inference_mode():
            return captions_from_hypotheses(self.vocab, decode(self.step_model, tensors, cfg))

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Release runtime sessions (the captioner cannot be used afterwards)."""
        while self._resources:
            self._resources.pop().__exit__(None, None, None)

    def __enter__(self) -> Captioner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Captioner({self.runtime_info.get('summary') or self.runtime_info})"


def bundle_decode_cfg(bundle: Any, vocab: Any, beam: int, length_level: int | None = None) -> Any:
    """The production ``DecodeCfg`` of a bundle: its decoding (beam search, or mask-predict for LaBERT) at
    ``length_level``, default the level recorded at export for length-controllable bundles (``cap(image)`` then
    needs no level)."""
    from edgecap.captioning import decode_cfg_for

    overrides: dict[str, Any] = {}
    if bundle.decoding == "mask_predict":
        overrides["strategy"] = "mask_predict"
    level = length_level if length_level is not None else bundle.default_length_level
    if level is not None:
        overrides["length_level"] = int(level)
    return decode_cfg_for(vocab, beam_size=beam, max_words=bundle.max_words, **overrides)


def _check_length_level(decoder: Any, level: Any, known: Sequence[tuple[int, int]] = ()) -> None:
    """A clear error for a level out of range, or for a model without length control (LaBERT §3.1)."""
    from edgecap.models.length import LengthLevelError, check_level

    levels = getattr(decoder, "length_levels", None) or known or None
    if levels is None:
        levels = getattr(getattr(decoder, "model", None), "length_levels", None)
    if levels is None and "length_level" not in _encoder_inputs(decoder):
        raise LengthLevelError("this model has no length control; length_level needs LaBERT or a *-len model")
    if levels:
        check_level(tuple(levels), level)


def _encoder_inputs(decoder: Any) -> tuple[str, ...]:
    encoder = getattr(decoder, "encoder", None)
    try:
        return tuple(encoder.input_metadata()) if encoder is not None else ()
    except Exception:  # an inactive runtime: nothing to learn from it
        return ()


# -- builders per runtime --------------------------------------------------------------------------------------------
def _default_device(device: str | None) -> torch.device:
    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise CaptionerError(f"device {device!r} requested but torch.cuda.is_available() is False")
        return dev
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _image_inputs(bundle: Any, device: torch.device, in_graph: bool) -> tuple[Any, str, str]:
    """(images -> inputs, backbone description, reason images cannot be captioned)."""
    spec = bundle.backbone_spec
    if not spec:
        return None, "none", (
            f"bundle {bundle.path} was exported from a run trained on precomputed region features: it captions "
            "features (Captioner.caption_inputs), not images"
        )  # fmt: skip
    if in_graph:
        return PixelInputs(spec), f"in the ONNX graph ({spec['name']}, {spec['image_size']} px)", ""
    backbone = backbone_from_spec(spec, weights=bundle.backbone_weights)
    return BackboneInputs(backbone, device), f"torch on {device} ({spec['name']}, {spec['image_size']} px)", ""


def _load_ort(
    bundle: Any,
    precision: str,
    threads: int | None,
    providers: Sequence[str] | str | None,
    device: str | None,
    available: Sequence[str],
) -> tuple[Any, Any, dict[str, Any], list[Any], str]:
    from edgecap.runtimes.decoders import create_ort_decoder
    from edgecap.runtimes.ort import resolve_providers

    chosen = resolve_providers(providers, available)
    primary = chosen[0]
    if precision == "auto":
        int8 = bundle.manifest["variants"].get("int8")
        precision, reason = _auto_precision(bundle.precisions, primary, int8)
    else:
        bundle.variant(precision)  # refuses, naming what the bundle holds
        reason = "requested"
        if precision == "int8" and primary == "CPUExecutionProvider":
            ok, why = _cpu_can_run_int8(bundle.variant("int8"))
            if not ok:
                log.warning("Captioner.load: %s; captions may be degraded (re-export with --target cpu-auto here)", why)
    bundle.check_graphs([precision])
    options: dict[str, Any] = {"providers": chosen}
    if threads:
        options["intra_op_threads"] = threads
    if "TensorrtExecutionProvider" in chosen:
        options["provider_options"] = {"tensorrt": _tensorrt_options(bundle, precision)}
    graphs = {role: bundle.graph_path(precision, role) for role in bundle.interface["runtime_graphs"]}
    step_model = create_ort_decoder(
        graphs, bundle.state_names, updated_state_names=bundle.updated_state_names, **options
    )
    step_model.__enter__()
    try:
        in_use = step_model.encoder.providers_in_use()
        on_gpu = in_use[0] in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
        torch_device = _default_device(device) if on_gpu else _default_device(device or "cpu")
        inputs, backbone, no_images = _image_inputs(bundle, torch_device, bundle.backbone_in_graph)
    except BaseException:
        step_model.__exit__(None, None, None)
        raise
    info = {
        "providers": in_use,
        "device": "cuda" if on_gpu else "cpu",
        "precision": precision,
        "precision_reason": reason,
        "backbone": backbone,
    }
    return step_model, inputs, info, [step_model], no_images


def _tensorrt_options(bundle: Any, precision: str) -> dict[str, Any]:
    """TensorRT EP: engines cached outside the bundle (it stays verifiable), keyed by the decoder graph's checksum."""
    from edgecap.runs import edgecap_home

    decoder_role = next(r for r in bundle.interface["runtime_graphs"] if r != "encoder")  # step or refine
    digest = bundle.manifest["files"][bundle.variant(precision)["files"][decoder_role]]["sha256"][:16]
    cache = edgecap_home() / "trt-engines" / f"{bundle.name}-{precision}-{digest}"
    cache.mkdir(parents=True, exist_ok=True)
    return {
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache),
        "trt_fp16_enable": precision == "fp16",
        "trt_int8_enable": precision == "int8",
    }


def _load_torch(
    bundle: Any,
    precision: str,
    threads: int | None,
    providers: Sequence[str] | str | None,
    device: str | None,
    available: Sequence[str],
) -> tuple[Any, Any, dict[str, Any], list[Any], str]:
    from edgecap.runtimes.refine import TorchRefineModel
    from edgecap.runtimes.torch import TorchStepModel

    if providers is not None:
        raise CaptionerError("providers= selects ONNX Runtime execution providers; runtime='torch' has none")
    dev = _default_device(device)
    refine = bundle.decoding == "mask_predict"
    if refine and precision == "fp16":
        raise CaptionerError("the torch mask-predict adapter runs FP32 weights; FP16 LaBERT needs runtime='ort'")
    if precision == "auto":
        precision = "fp16" if dev.type == "cuda" and not refine else "fp32"
        reason = f"torch on {dev.type}"
    elif precision == "int8":
        raise CaptionerError("the torch runtime runs FP32/FP16 weights; INT8 graphs need runtime='ort'")
    elif precision == "fp16" and dev.type != "cuda":
        raise CaptionerError("FP16 with the torch runtime needs a CUDA device; use fp32 on CPU")
    else:
        reason = "requested"
    model = bundle.load_torch_model(device=str(dev))
    if refine:
        step_model: Any = TorchRefineModel(model, dev)
    else:
        step_model = TorchStepModel(model, dev, dtype=torch.float16 if precision == "fp16" else None)
    inputs, backbone, no_images = _image_inputs(bundle, dev, in_graph=False)  # TorchStepModel casts to fp16
    info = {"providers": None, "device": str(dev), "precision": precision, "precision_reason": reason}
    info["backbone"] = backbone
    return step_model, inputs, info, [], no_images


def _describe(info: Mapping[str, Any]) -> str:
    where = ", ".join(info["providers"]) if info.get("providers") else info.get("device", "cpu")
    if info.get("decoding") == "mask_predict":
        search = f"mask-predict at length level {info.get('length_level')}"
    else:
        level = info.get("length_level")
        search = f"beam {info.get('beam')}" + (f" at length level {level}" if level is not None else "")
    return (
        f"{info.get('model')} on {info['runtime']} [{where}] at {info['precision']} "
        f"({info.get('precision_reason')}), {search}, backbone {info.get('backbone')}"
    )
