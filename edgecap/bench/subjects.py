"""What is benchmarked: a bundle on one runtime at one precision, as a :class:`Subject` the driver times.

This is the only module of ``edgecap.bench`` that knows bundles. It opens them through the public API
(``edgecap.runtime.bundle.load_bundle`` and ``Captioner.load``), so a bundle is benchmarked exactly as an application
runs
it, and it exposes what the measurement needs: the step model, the decoding config per beam, per-image inputs
(synthetic, from image files, or from the quality set) and the part of the pipeline that runs before the encoder.

Runtimes come from the runtime registry (:mod:`edgecap.runtime.backends.registry`): ``--runtime`` accepts every
registered
name, and one whose backend is not installed here is skipped with the registry's install hint. The built-in ones:

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

from edgecap.runtime.backends.registry import UnknownRuntimeError, get_runtime, list_runtimes
from edgecap.runtime.images.load import IMAGE_SUFFIXES, image_files

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


Item = dict[str, np.ndarray]


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


def bundle_input_kind(bundle: Any) -> str:
    """``"pixels"`` when the bundle captions images (a backbone in the graph or in its spec), else ``"features"``."""
    return "pixels" if bundle.backbone_in_graph or bundle.backbone_spec else "features"


def bundle_run_id(bundle: Any) -> str:
    """What identifies the trained weights behind a bundle: the captioner weights' and the backbone weights'
    SHA-256. Two bundles exported from the same run share it whether the backbone is in the graph or in torch, which
    is how a report pairs a pixels-in bundle with its torch-backbone twin."""
    files = bundle.manifest.get("files", {})
    weights = (files.get(bundle.config.get("weights", "weights.safetensors")) or {}).get("sha256") or "?"
    backbone = ((bundle.backbone_spec or {}).get("weights") or {}).get("sha256") or "none"
    return f"{weights[:16]}+{backbone[:16]}"


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


# -- inputs ----------------------------------------------------------------------------------------------------------
def list_images(directory: str | Path, limit: int | None = None) -> list[Path]:
    """Image files under ``directory`` (recursive, sorted), at most ``limit``.

    Raises:
        FileNotFoundError: ``directory`` does not exist.
        ValueError: it holds no image files.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"--images: {directory} is not a directory")
    paths = image_files(directory)
    if not paths:
        raise ValueError(f"--images: no image files in {directory} (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
    return paths[:limit] if limit else paths


def collate(items: Sequence[Item]) -> dict[str, np.ndarray]:
    """Stack per-image inputs into a batch; region features of different counts are right-padded and masked."""
    if not items:
        raise ValueError("collate needs at least one item")
    if "pixel_values" in items[0]:
        return {"pixel_values": np.stack([i["pixel_values"] for i in items])}
    regions = max(int(i["features"].shape[0]) for i in items)
    dim = int(items[0]["features"].shape[1])
    features = np.zeros((len(items), regions, dim), dtype=np.float32)
    boxes = np.zeros((len(items), regions, 4), dtype=np.float32)
    mask = np.zeros((len(items), regions), dtype=bool)
    for row, item in enumerate(items):
        n = int(item["features"].shape[0])
        features[row, :n] = item["features"]
        boxes[row, :n] = item["boxes"]
        mask[row, :n] = item.get("feature_mask", True)
    return {"features": features, "boxes": boxes, "feature_mask": mask}


@dataclass(frozen=True)
class QualitySet:
    """The fixed subset quality is measured on (the same images for every runtime/precision of a bundle).

    Attributes:
        description: what it is, for the report.
        image_ids: dataset image ids, in order.
        paths: image files (None entries for feature-only datasets).
        references: reference captions per image.
        features: the feature directory for bundles that caption region features, else None.
    """

    description: str
    image_ids: tuple[str, ...]
    paths: tuple[str | None, ...]
    references: tuple[tuple[str, ...], ...]
    features: str | None = None


def resolve_quality_set(
    bundle: Any, data: str | Path | None, features: str | Path | None, limit: int
) -> tuple[QualitySet | None, str]:
    """The quality subset for ``bundle``: the first ``limit`` images of the test split (val when there is none) of
    ``data``, or of the dataset the bundle was trained on when ``data`` is None and that dataset is on this machine.

    Returns:
        (the set, its description) or (None, why there is none).

    Raises:
        FileNotFoundError, ValueError: ``data``/``features`` were given explicitly but cannot be used.
    """
    from edgecap.build.data.datasets import load_dataset

    source = bundle.config.get("source") or {}
    explicit = data is not None
    if data is None:
        recorded = source.get("data")
        if not recorded or not Path(recorded).exists():
            return None, (
                "no quality data: the bundle's training dataset is not on this machine "
                f"({recorded or 'not recorded'}); pass --quality-data DIR"
            )
        data = recorded
    dataset = load_dataset(data)
    split = "test" if dataset.split("test") else "val"
    records = [r for r in dataset.split(split) if r.captions][:limit]
    if not records:
        message = f"quality data {data}: no test or val images with reference captions"
        if explicit:
            raise ValueError(message)
        return None, message
    feature_dir = None
    if bundle_input_kind(bundle) == "features":
        feature_dir = features or source.get("features")
        if not feature_dir or not Path(feature_dir).exists():
            message = (
                f"the bundle captions region features and no feature directory is available for {data} "
                f"({feature_dir or 'none recorded'}); pass --quality-features DIR"
            )
            if explicit or features is not None:
                raise FileNotFoundError(message)
            return None, message
    elif any(r.path is None for r in records):
        raise ValueError(f"quality data {data}: the bundle captions images but the dataset has no image files")
    quality = QualitySet(
        description=f"{split} split of {data}, first {len(records)} images",
        image_ids=tuple(r.image_id for r in records),
        paths=tuple(str(r.path) if r.path is not None else None for r in records),
        references=tuple(tuple(" ".join(c) for c in r.captions) for r in records),
        features=str(feature_dir) if feature_dir else None,
    )
    return quality, quality.description


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
        from edgecap.build.data.sources import open_feature_source

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
