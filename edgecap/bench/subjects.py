"""What is benchmarked: a bundle on one runtime at one precision, as a :class:`Subject` the driver times.

This module and the ones it re-exports (below) are the only part of ``edgecap.bench`` that knows bundles. It opens
them through the public API (``edgecap.runtime.bundle.load_bundle`` and ``Captioner.load``), so a bundle is
benchmarked exactly as an application runs it, and it exposes what the measurement needs: the step model, the
decoding config per beam, per-image inputs (synthetic, from image files, or from the quality set) and the part of the
pipeline that runs before the encoder.

Runtimes come from the runtime registry (:mod:`edgecap.runtime.backends.registry`): ``--runtime`` accepts every
registered name, and one whose backend is not installed here is skipped with the registry's install hint. The built-in
ones:

- ``torch``: the bundle's ``weights.safetensors`` in torch eager (cached decoding);
- ``torch-rerun`` (a registry ``baseline``): the same weights re-running the decoder over the whole prefix every step
  as the reference implementations do — the baseline every report's "speed-up vs re-run prefix" column divides by;
- ``onnxruntime``: the bundle's ONNX graphs of the precision in ONNX Runtime.

A mask-predict bundle (LaBERT) runs on ``torch`` (FP32) and ``onnxruntime``; a re-run-prefix baseline has no meaning
for it (there is no prefix to re-run) and is skipped with that reason.

Nothing here imports torch unless the subject needs it (a torch runtime, a backbone rebuilt in torch): inputs are
numpy arrays, so a runtime-only install (numpy, Pillow, ONNX Runtime) benchmarks a pixels-in bundle end to end.

What the timed region covers: from encoder inputs to caption strings. When the bundle takes images (its backbone is
inside the encoder graph, or rebuilt in torch from the bundle's spec) the timed region starts at preprocessed pixels
and includes the backbone; image decoding and resizing are measured separately and not timed (MLPerf lists them as
untimed pre-processing). A bundle trained on precomputed region features starts at features.

The subject is this module's job; what it builds on lives beside it and is re-exported here: which combinations are
skipped (:mod:`edgecap.bench.skips`), what a bundle is labelled with (:mod:`edgecap.bench.bundle_facts`), the quality
subset (:mod:`edgecap.bench.quality_set`) and per-image inputs (:mod:`edgecap.bench.inputs`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.bench.bundle_facts import bundle_input_kind, bundle_run_id
from edgecap.bench.inputs import Item, collate, list_images
from edgecap.bench.quality_set import QualitySet, resolve_quality_set
from edgecap.bench.skips import skip_reason
from edgecap.runtime.backends.registry import get_runtime

__all__ = [
    "QualitySet",
    "Subject",
    "bundle_input_kind",
    "bundle_run_id",
    "collate",
    "inference_mode",
    "list_images",
    "open_subject",
    "resolve_quality_set",
    "skip_reason",
]


@contextlib.contextmanager
def inference_mode() -> Iterator[None]:
    """torch's inference mode when torch is in use in this process (a torch runtime or backbone), else nothing: a
    runtime-only process never imports torch for it."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    with torch.inference_mode():
        yield


# -- the subject -----------------------------------------------------------------------------------------------------
@dataclass
class Subject:
    """A loaded bundle on one runtime/precision, ready to be timed.

    Attributes:
        step_model: the :class:`~edgecap.runtime.decoding.StepModel` (the driver wraps it in a timing proxy).
        vocab: token ids -> words.
        max_words: the bundle's caption length limit.
        input_kind: ``"pixels"`` or ``"features"`` — where the timed region starts.
        backbone_where: ``"torch"`` (run before the encoder, timed as ``backbone``), ``"graph"`` (inside the
            encoder graph, timed as ``encoder``) or None (region features).
        device: where the work runs (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        info: runtime, providers, device, precision as ``Captioner.load`` chose them.
        load_s: seconds to load (``Captioner.load`` with checksums off; the parent verified them once).
        size_bytes, files: on-disk size of what this runtime/precision loads, and those files.
        parameters, backbone_parameters: parameter counts (backbone: when it runs in torch).
        bundle: the opened bundle (its decoding and length plan make the decode configs).
    """

    step_model: Any
    vocab: Any
    max_words: int
    input_kind: str
    backbone_where: str | None
    device: str
    info: dict[str, Any]
    load_s: float
    size_bytes: int
    files: list[str]
    parameters: int | None
    backbone_parameters: int | None
    bundle: Any = None
    _backbone: Any = None
    _preprocess: Callable[[Any], Any] | None = None
    _feature_dim: int | None = None
    _image_size: int | None = None
    _closers: list[Callable[[], Any]] = field(default_factory=list)

    def decode_cfg(self, beam: int, length_level: int | None = None) -> Any:
        """The bundle's production decoding config at beam size ``beam`` (1 = greedy; mask-predict ignores it) and
        ``length_level`` (None: the bundle's default level, or none for a model without length control)."""
        from edgecap.runtime.captioner import bundle_decode_cfg

        return bundle_decode_cfg(self.bundle, self.vocab, beam, length_level)

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def sync(self) -> Callable[[], Any] | None:
        """``torch.cuda.synchronize`` when torch runs on CUDA here (timings must cover kernels, not launches), else
        None (ONNX Runtime's ``run`` returns host arrays: it has synchronised already)."""
        torch = sys.modules.get("torch")
        if self.on_cuda and torch is not None and torch.cuda.is_available():
            device = self.device
            return lambda: torch.cuda.synchronize(device)
        return None

    # -- per-image inputs (untimed preparation) ----------------------------------------------------------------------
    def synthetic_items(self, count: int, seed: int, regions: int) -> list[Item]:
        """``count`` random inputs: normalised pixels at the backbone's size, or ``regions`` non-negative region
        features (post-ReLU statistics) with random valid boxes."""
        rng = np.random.default_rng(seed)
        items: list[Item] = []
        for _ in range(count):
            if self.input_kind == "pixels":
                size = int(self._image_size or 224)
                items.append({"pixel_values": rng.standard_normal((3, size, size), dtype=np.float32)})
            else:
                dim = int(self._feature_dim or 0)
                corner = rng.random((regions, 2), dtype=np.float32) * 0.7
                extent = 0.05 + rng.random((regions, 2), dtype=np.float32) * 0.25
                items.append(
                    {
                        "features": np.clip(rng.standard_normal((regions, dim), dtype=np.float32), 0, 6),
                        "boxes": np.concatenate([corner, corner + extent], axis=1),
                        "feature_mask": np.ones(regions, dtype=bool),
                    }
                )
        return items

    def image_items(self, paths: Sequence[str | Path]) -> tuple[list[Item], float]:
        """Preprocessed pixels of image files, and the mean preprocessing time per image in seconds (untimed in the
        end-to-end latency, reported on its own)."""
        if self._preprocess is None:
            raise ValueError(
                "this bundle captions precomputed region features, not images: use --synthetic N (or --quality-data "
                "with --quality-features)"
            )
        items, total = [], 0.0
        for path in paths:
            start = time.perf_counter()
            pixels = self._preprocess(path)
            total += time.perf_counter() - start
            items.append({"pixel_values": np.asarray(pixels, dtype=np.float32)})
        return items, total / max(1, len(paths))

    def feature_items(self, directory: str | Path, image_ids: Sequence[str]) -> list[Item]:
        """Region features of ``image_ids`` from a feature directory (a feature cache or a region-feature store)."""
        from edgecap.workshop.data.sources import open_feature_source

        source = open_feature_source(directory)
        missing = [i for i in image_ids if i not in source]
        if missing:
            raise FileNotFoundError(f"{directory}: no features for {len(missing)} image(s), e.g. {missing[:3]}")
        items = []
        for image_id in image_ids:
            features, boxes = source.get(image_id)
            items.append(
                {
                    "features": np.asarray(features, dtype=np.float32),
                    "boxes": np.asarray(boxes, dtype=np.float32),
                    "feature_mask": np.ones(len(features), dtype=bool),
                }
            )
        return items

    # -- the timed part before the encoder ---------------------------------------------------------------------------
    def to_inputs(self, batch: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Encoder inputs for a collated batch: the torch backbone's grid features (torch tensors on its device, which
        the runtime adapters take as ``Captioner`` hands them over) when it runs outside the graph, else the batch
        itself (numpy pixels for an in-graph backbone, region features)."""
        if self.backbone_where != "torch":
            return dict(batch)
        import torch

        with torch.inference_mode():
            pixels = torch.from_numpy(np.ascontiguousarray(batch["pixel_values"])).to(self.device, non_blocking=True)
            features, boxes = self._backbone(pixels)
            mask = torch.ones(features.shape[:2], dtype=torch.bool, device=features.device)
        return {"features": features, "boxes": boxes, "feature_mask": mask}

    def close(self) -> None:
        while self._closers:
            self._closers.pop()()


def _file_bytes(bundle: Any, names: Sequence[str]) -> int:
    files = bundle.manifest["files"]
    return sum(int(files[n]["bytes"]) for n in names if n in files)


def _parameter_count(module: Any) -> int | None:
    parameters = getattr(module, "parameters", None)
    return sum(int(p.numel()) for p in parameters()) if callable(parameters) else None


def _pixel_path(inputs: Any) -> tuple[Any, Any, str | None]:
    """(torch backbone or None, preprocessing ``path -> CHW float32``, where the backbone runs) of a captioner's
    image inputs, read by duck typing so the bench needs no torch to recognise them."""
    if inputs is None:
        return None, None, None
    backbone = getattr(inputs, "backbone", None)
    if backbone is not None:
        return backbone, backbone.preprocess_cfg, "torch"
    cfg = getattr(inputs, "cfg", None)
    return (None, cfg, "graph") if cfg is not None else (None, None, None)


def open_subject(
    bundle: Any,
    runtime: str,
    precision: str,
    *,
    device: str | None = None,
    threads: int | str | None = None,
    spin: bool | None = None,
    providers: Sequence[str] | None = None,
    step_mode: str = "eager",
    trt_opt_batch: int | None = None,
) -> Subject:
    """Load ``bundle`` (a verified :class:`~edgecap.runtime.bundle.Bundle`) on ``runtime`` at ``precision``
    (``trt_opt_batch``:
    the images per call ONNX Runtime's TensorRT provider tunes for, None = its default).

    Raises:
        ValueError: the runtime is unknown (:class:`~edgecap.runtime.backends.registry.UnknownRuntimeError`);
            ``Captioner.load`` errors (``CaptionerError``, ``BundleError``) pass through with their messages.
    """
    spec = get_runtime(runtime)
    graphs = spec.graph_runtime is not None and not spec.torch
    start = time.perf_counter()
    from edgecap.runtime.captioner import Captioner

    captioner = Captioner.load(
        bundle.path,
        runtime=runtime,
        precision=precision,
        threads=threads,
        spin=spin,
        providers=list(providers) if (providers and graphs) else None,
        device=None if device in (None, "auto") else device,
        verify=False,
        step_mode=step_mode if step_mode in spec.step_modes else "eager",  # e.g. the torch-rerun baseline
        trt_opt_batch=trt_opt_batch,
    )
    load_s = time.perf_counter() - start
    step_model = captioner.step_model
    try:
        backbone, preprocess, backbone_where = _pixel_path(captioner.inputs)
        image_size = getattr(preprocess, "image_size", None)
        info = dict(captioner.runtime_info)
        info.pop("summary", None)
        model_device = getattr(step_model, "device", None)
        run_device = str(model_device) if model_device is not None else str(info.get("device") or "cpu")
        if graphs:
            files = sorted(set(bundle.variant(precision)["files"].values()))
        else:
            files = [bundle.config.get("weights", "weights.safetensors")]
        if backbone_where == "torch" and bundle.backbone_weights is not None:
            files.append(str(bundle.backbone_weights.relative_to(bundle.path)))
        parameters = bundle.manifest.get("model", {}).get("parameters")
        if parameters is None:
            parameters = _parameter_count(getattr(step_model, "model", None))
    except BaseException:
        captioner.close()
        raise
    subject = Subject(
        step_model=step_model,
        vocab=captioner.vocab,
        max_words=bundle.max_words,
        input_kind="pixels" if preprocess is not None else "features",
        backbone_where=backbone_where,
        device=run_device,
        info=info,
        load_s=load_s,
        size_bytes=_file_bytes(bundle, files),
        files=files,
        parameters=int(parameters) if parameters is not None else None,
        backbone_parameters=_parameter_count(backbone) if backbone is not None else None,
        bundle=bundle,
        _backbone=backbone,
        _preprocess=preprocess,
        _feature_dim=bundle.config["model"].get("feature_dim"),
        _image_size=image_size,
    )
    subject._closers.append(captioner.close)
    return subject
