"""``export_bundle``: a trained run (or a bundle) -> a verified bundle with FP32 (+ FP16, + INT8) graphs.

A run trained on a backbone's features gets a pixels-in bundle by default: the backbone is inside the encoder graph
(input ``pixel_values``) at every precision, so an edge device captions images with ONNX Runtime alone and INT8
covers the backbone's convolutions too. Region-feature runs (and runs on a randomly initialised backbone, which
cannot be rebuilt) take features. Without ``out`` the bundle goes to ``$EDGECAP_HOME/bundles/NAME``.

Stages, all inside one temporary directory that is renamed onto ``out`` only when everything passed
(:func:`~edgecap.bundle.writer.create_bundle`; a bundle already there stays until then):

1. export the model's graphs with :func:`edgecap.export.export_onnx`; every graph's element-wise parity against
   torch must pass at every precision, else the export fails and leaves nothing;
2. write config, vocab, weights (and the backbone's local weights file when the run used one);
3. INT8 (``int8=True``): turn the calibration images into encoder feeds (backbone features computed by the run's
   backbone, or preprocessed pixels when the backbone is in the graph), quantise with
   :func:`edgecap.calibration.quantize_int8` for ``target``, write the QDQ graphs and the ranges (TensorRT builds
   from the QDQ graphs: no calibration table);
4. task-level check of every variant against the torch FP32 model on a held-out set: CIDEr-D of both, the
   difference, and caption agreement (``edgecap.calibration.compare_decoders``). The held-out set is the run's
   val split when its dataset is reachable, else calibration images kept out of calibration (scored against the
   FP32 captions); the manifest names the set and its size;
5. the manifest (checksums, versions, parity, quality), then a full verification with the reader.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgecap.bundle.manifest import PRECISION_ORDER, parity_summary, sha256_file
from edgecap.bundle.reader import CONFIG_NAME, VOCAB_NAME, WEIGHTS_NAME, is_bundle, load_bundle
from edgecap.bundle.writer import BundleBuilder, create_bundle
from edgecap.data.images import IMAGE_SUFFIXES, image_files

__all__ = [
    "DEFAULT_CALIB_SIZE",
    "DEFAULT_QUALITY_IMAGES",
    "IMAGE_SUFFIXES",
    "BundleExportError",
    "CalibImage",
    "ExportSource",
    "calibration_images",
    "default_bundle_out",
    "export_bundle",
    "int8_targets",
    "load_source",
]

log = logging.getLogger(__name__)

DEFAULT_CALIB_SIZE = 256
DEFAULT_QUALITY_IMAGES = 100
_BATCH = 16
#: When the held-out set comes out of the calibration images: at most this share of them is kept out.
_HOLDOUT_SHARE = 0.2


class BundleExportError(ValueError):
    """An export that cannot proceed or whose checks failed; the message names the input or the failing graph."""


def int8_targets() -> list[str]:
    """The INT8 targets export accepts: the registered ``edgecap.calibration`` presets (``register_preset`` adds
    one) plus ``cpu-auto``, which picks the preset for the exporting machine's CPU."""
    from edgecap.calibration.presets import list_presets

    return list_presets()


# -- what is exported ------------------------------------------------------------------------------------------------
@dataclass
class ExportSource:
    """A trained captioner with everything a bundle records about it.

    Attributes:
        name: the model name (``acort-xsmall``).
        model: the eval-mode ``CaptionModel``.
        vocab: its vocabulary.
        model_config: the run config's ``model`` section (name, vocab size, feature dim, overrides, cfg).
        max_words: the longest caption in words (decode default).
        backbone_spec: ``Backbone.spec`` of the features the model was trained on ({} for region features).
        backbone_weights: the backbone's local weights file, when the spec says they came from a file.
        data, features: the run's dataset and feature directories (None when unknown).
        origin: where it came from, for messages and the bundle config.
        weights_sha256: SHA-256 of the run's weights file (lets a caller tell whether a bundle is up to date).
        beam: the default beam size recorded in the bundle.
    """

    name: str
    model: torch.nn.Module
    vocab: Any
    model_config: dict[str, Any]
    max_words: int
    backbone_spec: dict[str, Any]
    backbone_weights: Path | None
    data: Path | None
    features: Path | None
    origin: str
    weights_sha256: str | None = None
    beam: int = 3

    def backbone(self) -> Any:
        """The run's backbone, rebuilt and checked against its spec (raises ``BackboneMismatchError``)."""
        from edgecap.captioner import backbone_from_spec

        return backbone_from_spec(self.backbone_spec, weights=self.backbone_weights)

    @property
    def backbone_source(self) -> str | None:
        return (self.backbone_spec.get("weights") or {}).get("source") if self.backbone_spec else None

    @property
    def backbone_rebuildable(self) -> bool:
        """Whether the backbone the features came from can be rebuilt (packaged or file weights, not random ones)."""
        return self.backbone_source in REBUILDABLE_BACKBONES


#: Backbone weight sources a bundle can rebuild, and so put in its encoder graph.
REBUILDABLE_BACKBONES = ("packaged", "file")


def default_bundle_out(model_or_run: Any) -> Path:
    """Where ``edgecap export`` writes without ``--out``: ``$EDGECAP_HOME/bundles/NAME``, the place the quickstart
    writes and lookups by name read. ``NAME`` is the model name given, or for a run directory, a bundle or a
    :class:`~edgecap.runs.TrainedRun` the model name its config records (only ``config.json`` is read)."""
    import json

    from edgecap.bundle.reader import default_bundle_dir
    from edgecap.runs import TrainedRun

    if isinstance(model_or_run, TrainedRun):
        return default_bundle_dir(str(model_or_run.config["model"]["name"]))
    config = Path(model_or_run) / CONFIG_NAME
    if config.is_file():
        try:
            name = json.loads(config.read_text(encoding="utf-8"))["model"]["name"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BundleExportError(f"{config}: cannot read the model name ({exc}); pass --out BUNDLE") from exc
        return default_bundle_dir(str(name))
    return default_bundle_dir(str(model_or_run))


def load_source(model_or_run: Any, backbone_weights: str | Path | None = None) -> ExportSource:
    """Resolve what ``edgecap export --model`` names: a :class:`~edgecap.runs.TrainedRun`, a run directory, a model
    name trained earlier (``$EDGECAP_HOME/runs/NAME``), or an existing bundle (re-export, e.g. to add INT8).

    Raises:
        RunError: nothing trained under that name/path (the message says where it looked and what to do).
        BundleExportError: the run's backbone used a local weights file that was not passed.
    """
    from edgecap.runs import TrainedRun, load_run

    weights = Path(backbone_weights) if backbone_weights is not None else None
    if isinstance(model_or_run, (str, Path)) and is_bundle(model_or_run):
        bundle = load_bundle(model_or_run)
        source_info = bundle.config.get("source") or {}
        source = ExportSource(
            name=bundle.name,
            model=bundle.load_torch_model(),
            vocab=bundle.load_vocab(),
            model_config=dict(bundle.config["model"]),
            max_words=bundle.max_words,
            backbone_spec=bundle.backbone_spec,
            backbone_weights=weights or bundle.backbone_weights,
            data=_existing(source_info.get("data")),
            features=_existing(source_info.get("features")),
            origin=f"bundle {bundle.path}",
            weights_sha256=source_info.get("weights_sha256"),
            beam=bundle.beam,
        )
    else:
        run = model_or_run if isinstance(model_or_run, TrainedRun) else load_run(model_or_run)
        source = ExportSource(
            name=str(run.config["model"]["name"]),
            model=run.model,
            vocab=run.vocab,
            model_config=dict(run.config["model"]),
            max_words=run.max_words,
            backbone_spec=run.backbone_spec,
            backbone_weights=weights,
            data=_existing(run.config.get("data")),
            features=_existing(run.config.get("features")),
            origin=f"run {run.path}",
            weights_sha256=sha256_file(run.path / WEIGHTS_NAME) if (run.path / WEIGHTS_NAME).is_file() else None,
        )
    if source.backbone_source == "file" and source.backbone_weights is None:
        file = source.backbone_spec["weights"].get("file")
        raise BundleExportError(
            f"the {source.origin} was trained on features of a backbone with local weights {file!r}: pass that file "
            "(--backbone-weights FILE) so the bundle can carry it and caption images"
        )
    source.model.eval()
    return source


def _existing(path: str | None) -> Path | None:
    return Path(path) if path and Path(path).exists() else None


# -- calibration and held-out images ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class CalibImage:
    """One calibration image: its file, and its dataset image id (the file stem for a plain folder)."""

    path: Path
    image_id: str


def calibration_images(calib: str | Path) -> tuple[list[CalibImage], str]:
    """The images of a calibration folder (searched recursively) or of a dataset directory's train split.

    Returns:
        (images, a description for the manifest).

    Raises:
        FileNotFoundError: ``calib`` does not exist.
        BundleExportError: no image files in it (an empty calibration set).
    """
    from edgecap.data.datasets import load_dataset

    calib = Path(calib)
    if not calib.exists():
        raise FileNotFoundError(f"calibration set not found: {calib}")
    if (calib / "dataset.json").is_file() or calib.is_file():
        dataset = load_dataset(calib)
        images = [CalibImage(r.path, r.image_id) for r in dataset.split("train") if r.path is not None]
        description = f"train split of dataset {calib}"
    else:
        paths = image_files(calib)
        images = [CalibImage(p, p.stem) for p in paths]
        description = f"images in {calib}"
    if not images:
        raise BundleExportError(
            f"the calibration set is empty: {description} has no images "
            f"(looked for {', '.join(sorted(IMAGE_SUFFIXES))}); INT8 needs representative images"
        )
    return images, description


def _describe_skipped(skipped: Mapping[str, str], limit: int = 3) -> str:
    """``path: reason`` for the first few, without the path twice when the reason already names it."""
    return "; ".join(why if why.startswith(path) else f"{path}: {why}" for path, why in list(skipped.items())[:limit])


def _check_some_image_loads(images: Sequence[CalibImage], description: str) -> None:
    """Refuse a calibration set none of whose image files decodes (e.g. a folder of non-images named ``*.jpg``),
    stopping at the first one that does: one decode for a good set."""
    from edgecap.data.images import ImageError, load_image

    failed: dict[str, str] = {}
    for image in images:
        try:
            load_image(image.path)
            return
        except (ImageError, OSError) as exc:
            failed[str(image.path)] = str(exc)
    raise BundleExportError(
        f"the calibration set is empty: none of the {len(images)} files of {description} is a readable image "
        f"({_describe_skipped(failed)})"
    )


@dataclass
class _Images:
    """Images turned into encoder inputs, with the ones that could not be read set aside."""

    ids: list[str] = field(default_factory=list)
    batches: list[dict[str, np.ndarray]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)


class _InputMaker:
    """Encoder inputs (``decode_inputs`` of the spec) for lists of images or feature-store ids.

    - backbone in the graph: ``pixel_values`` preprocessed exactly like ``Backbone.preprocess``;
    - backbone outside: the torch backbone's grid features and boxes (all cells valid);
    - region-feature runs: features from the run's feature store, padded with a mask.
    """

    def __init__(self, source: ExportSource, backbone: Any | None, with_backbone: bool) -> None:
        self.source, self.backbone, self.with_backbone = source, backbone, with_backbone
        self._store: Any = None

    @property
    def from_images(self) -> bool:
        return self.backbone is not None

    def images(self, paths: Sequence[Path], progress: Callable[[int], None] | None = None) -> _Images:
        from edgecap.data.images import ImageError

        out = _Images()
        pending: list[tuple[str, np.ndarray]] = []
        for path in paths:
            try:
                pending.append((str(path), self.backbone.preprocess_cfg(path)))
            except (ImageError, OSError) as exc:
                out.skipped[str(path)] = str(exc)
            if len(pending) == _BATCH:
                self._flush(pending, out)
                pending = []
            if progress is not None:
                progress(1)
        if pending:
            self._flush(pending, out)
        return out

    def _flush(self, pending: list[tuple[str, np.ndarray]], out: _Images) -> None:
        pixels = np.stack([p for _, p in pending])
        out.ids.extend(i for i, _ in pending)
        if self.with_backbone:
            out.batches.append({"pixel_values": pixels})
            return
        with torch.inference_mode():
            features, boxes = self.backbone(torch.from_numpy(pixels))
        out.batches.append(
            {
                "features": features.float().numpy(),
                "boxes": boxes.float().numpy(),
                "feature_mask": np.ones(features.shape[:2], dtype=bool),
            }
        )

    def stored(self, ids: Sequence[str]) -> _Images:
        from edgecap.data.sources import open_feature_source
        from edgecap.training.batches import FeatureBank

        if self.source.features is None:
            raise BundleExportError(
                f"the {self.source.origin} was trained on precomputed region features and its feature directory is "
                "not available: features for calibration/held-out images cannot be computed"
            )
        if self._store is None:
            self._store = open_feature_source(self.source.features)
        present = [i for i in ids if i in self._store]
        out = _Images(skipped={i: f"no features in {self.source.features}" for i in ids if i not in self._store})
        if present:
            bank = FeatureBank(self._store, present)
            for start in range(0, len(present), _BATCH):
                visual = bank.batch(list(range(start, min(start + _BATCH, len(present)))))
                out.batches.append({k: v.numpy() for k, v in visual.as_inputs().items()})
            out.ids.extend(present)
        return out


def _sample(items: Sequence[Any], size: int, seed: int = 0) -> list[Any]:
    """``size`` items spread over the whole list (seeded, in original order), or all of them."""
    if len(items) <= size:
        return list(items)
    keep = sorted(random.Random(seed).sample(range(len(items)), size))
    return [items[i] for i in keep]


@dataclass
class _HeldOut:
    """The task-level check's images: encoder inputs, references (None = score against FP32 captions)."""

    inputs: _Images
    references: list[list[str]] | None
    description: str


def _held_out_from_dataset(source: ExportSource, maker: _InputMaker, limit: int) -> _HeldOut | None:
    from edgecap.data.datasets import load_dataset

    if source.data is None or not (maker.from_images or source.features is not None):
        return None  # no dataset, or neither a backbone nor the feature store to turn its images into inputs
    try:
        dataset = load_dataset(source.data)
    except (ValueError, FileNotFoundError) as exc:
        log.warning("held-out set: cannot read the run's dataset %s (%s)", source.data, exc)
        return None
    records = dataset.split("val")[:limit]
    if not records:
        return None
    if maker.from_images:
        paths = [r.path for r in records if r.path is not None]
        inputs = maker.images(paths)
        by_id = {str(r.path): r for r in records}
    else:
        inputs = maker.stored([r.image_id for r in records])
        by_id = {r.image_id: r for r in records}
    if not inputs.ids:
        return None
    refs = [[" ".join(c) for c in by_id[i].captions] for i in inputs.ids]
    return _HeldOut(inputs, refs, f"val split of dataset {source.data} ({len(inputs)} images, human references)")


def _held_out_record(held_out: _HeldOut | None) -> dict[str, Any] | None:
    if held_out is None:
        return None
    return {"set": held_out.description, "images": len(held_out.inputs), "skipped": len(held_out.inputs.skipped)}


# -- the task-level check --------------------------------------------------------------------------------------------
class _PixelReference:
    """The torch FP32 reference of a bundle whose encoder graph contains the backbone: ``pixel_values`` through the
    torch backbone, then the captioner's own decoder adapter (a :class:`~edgecap.decoding.StepModel`, or LaBERT's
    refine model), to which everything but ``encode`` is handed on."""

    def __init__(self, backbone: torch.nn.Module, inner: Any) -> None:
        self.backbone, self.inner = backbone.eval(), inner

    def encode(self, inputs: Mapping[str, torch.Tensor]) -> Any:
        with torch.inference_mode():
            features, boxes = self.backbone(torch.as_tensor(inputs["pixel_values"]))
        return self.inner.encode({"features": features, "boxes": boxes})

    def __getattr__(self, name: str) -> Any:
        if name in ("backbone", "inner"):  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def _torch_batches(images: _Images) -> list[dict[str, torch.Tensor]]:
    return [{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()} for batch in images.batches]


def _fp32_references(reference: Any, batches: Sequence[Mapping[str, torch.Tensor]], vocab: Any, cfg: Any) -> list:
    from edgecap.captioning import captions_from_hypotheses
    from edgecap.decoding import decode

    out: list[list[str]] = []
    for batch in batches:
        out.extend([c] for c in captions_from_hypotheses(vocab, decode(reference, batch, cfg)))
    return out


def _task_check(
    reference: Any,
    models: Mapping[str, Any],
    spec: Any,
    held_out: _HeldOut,
    references: list[list[str]],
    vocab: Any,
    cfg: Any,
) -> dict[str, Any]:
    """CIDEr-D of the torch FP32 reference and of ``models`` on ONNX Runtime (CPU), their difference, agreement."""
    from edgecap.calibration import compare_decoders
    from edgecap.runtimes.decoders import create_ort_decoder

    batches = _torch_batches(held_out.inputs)
    with create_ort_decoder(
        models, spec.state_names, updated_state_names=spec.step_state_names, providers=("cpu",)
    ) as candidate:
        measured = compare_decoders(reference, candidate, batches, references, vocab, cfg)
    return {
        "set": held_out.description,
        "images": len(held_out.inputs),
        "references": "human captions" if held_out.references is not None else "torch FP32 captions",
        "reference": "torch FP32",
        "beam": cfg.beam_size if cfg.strategy == "beam" else 1,
        "decoding": cfg.strategy,
        "length_level": cfg.length_level,
        **_quality_fields(measured),
    }


def _quality_fields(measured: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's fields from :func:`compare_decoders`'s report (agreements as fractions; CIDEr-D on the
    pycocoevalcap scale, where 1.0 reads "100")."""
    return {
        "reference_cider_d": float(measured["cider_d_reference"]),
        "candidate_cider_d": float(measured["cider_d_candidate"]),
        "cider_d_delta": float(measured["cider_d_delta"]),
        "agreement": float(measured["caption_agreement_pct"]) / 100.0,
        "token_agreement": float(measured["token_agreement_pct"]) / 100.0,
        "mean_length_reference": float(measured["mean_length_reference"]),
        "mean_length_candidate": float(measured["mean_length_candidate"]),
        "differing_examples": list(measured.get("differing_examples", [])),
    }


# -- the export ------------------------------------------------------------------------------------------------------
class _Stages:
    """One line per stage on stderr (quiet when ``progress`` is False)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self._console: Any = None
        if enabled:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False, soft_wrap=True)

    def __call__(self, text: str) -> None:
        self.done += 1
        log.info("export %d/%d: %s", self.done, self.total, text)
        if self._console is not None:
            self._console.print(f"[bold]{self.done}/{self.total}[/] {text}")

    def note(self, text: str) -> None:
        log.info("export: %s", text)
        if self._console is not None:
            self._console.print(f"    {text}")

    def warn(self, text: str) -> None:
        log.warning("export: %s", text)
        if self._console is not None:
            self._console.print(f"    [yellow]warning:[/] {text}")


def _check_arguments(int8: bool, calib: Any, target: str, calib_size: int, quality_images: int) -> None:
    targets = int8_targets()
    if target not in targets:
        raise BundleExportError(f"unknown INT8 target {target!r}; choose one of {targets}")
    if int8 and calib is None:
        raise BundleExportError("INT8 export needs calibration images: pass calib=DIR (--calib DIR)")
    if calib is not None and not int8:
        raise BundleExportError("calib= is only used for INT8: pass int8=True (--int8) or drop it")
    if calib_size < 1:
        raise BundleExportError(f"calib_size must be >= 1, got {calib_size}")
    if quality_images < 0:
        raise BundleExportError(f"quality_images must be >= 0, got {quality_images}")


def _parity_failures(result: Any) -> list[str]:
    failures = []
    for (graph, precision), entry in result.graphs.items():
        report = entry.parity
        if report is None or report["passed"]:
            continue
        bad = [
            f"{name}: max |err| {out['max_abs']:.3g} > atol {out['atol']:.3g} + rtol {out['rtol']:.3g}·|ref|"
            for name, out in report["outputs"].items()
            if not out["passed"]
        ]
        failures.append(f"{graph} ({precision}): {'; '.join(bad[:3])}")
    return failures


def _bundle_config(source: ExportSource, with_backbone: bool, backbone_file: str | None) -> dict[str, Any]:
    family = getattr(getattr(source.model, "cfg", None), "family", None)
    return {
        "model": {**source.model_config, "family": family},
        "vocab": {"kind": source.vocab.kind, "size": source.vocab.size, "file": VOCAB_NAME},
        "weights": WEIGHTS_NAME,
        "backbone": source.backbone_spec or None,
        "backbone_in_graph": with_backbone,
        "backbone_weights": backbone_file,
        "decode": {"max_words": source.max_words, "beam": source.beam},
        "source": {
            "origin": source.origin,
            "data": str(source.data) if source.data else None,
            "features": str(source.features) if source.features else None,
            "weights_sha256": source.weights_sha256,
        },
    }


def _write_model_files(bundle: BundleBuilder, source: ExportSource, with_backbone: bool) -> None:
    from edgecap.training.checkpoint import save_weights

    backbone_file = None
    if source.backbone_source == "file" and source.backbone_weights is not None:
        backbone_file = f"backbone/{source.backbone_weights.name}"
        bundle.copy_file(source.backbone_weights, backbone_file)
    bundle.write_json(CONFIG_NAME, _bundle_config(source, with_backbone, backbone_file))
    source.vocab.save(bundle.path(VOCAB_NAME))
    save_weights(source.model, bundle.path(WEIGHTS_NAME))


def export_bundle(
    model_or_run: Any,
    out: str | Path | None = None,
    *,
    fp16: bool = False,
    int8: bool = False,
    calib: str | Path | None = None,
    target: str = "cpu-auto",
    calib_size: int = DEFAULT_CALIB_SIZE,
    with_backbone: bool | None = None,
    overwrite: bool = False,
    progress: bool = True,
    backbone_weights: str | Path | None = None,
    quality_images: int = DEFAULT_QUALITY_IMAGES,
) -> Path:
    """Export a trained run to a verified bundle directory (FP32 always; FP16 and INT8 on request).

    Args:
        model_or_run: a model name trained earlier (``$EDGECAP_HOME/runs/NAME``), a run directory, a
            :class:`~edgecap.runs.TrainedRun`, or a bundle (re-export from its weights).
        out: the bundle directory to create. Default :func:`default_bundle_out` (``$EDGECAP_HOME/bundles/NAME``),
            where an existing bundle is replaced without ``overwrite``: the new one is built beside it, verified,
            then swapped in atomically.
        fp16: also export float16 graphs (for GPUs/NPUs; slower than FP32 on ONNX Runtime's CPU provider).
        int8: also write INT8 (QDQ) graphs calibrated on ``calib``.
        calib: a folder of images (searched recursively; unreadable files are skipped and counted) or a dataset
            directory (its train split images).
        target: INT8 preset, one of :func:`int8_targets`: ``cpu-auto`` (this CPU), ``cpu-avx2``, ``cpu-vnni``,
            ``arm64``, ``tensorrt`` or a preset added with ``edgecap.calibration.register_preset``.
        calib_size: calibrate on at most this many images (a seeded sample spread over the set).
        with_backbone: put the image backbone in the encoder graph (input ``pixel_values``: pixels to captions in
            one runtime, no torch needed to caption images) or not (the encoder takes backbone features and
            ``Captioner.load`` runs the backbone in torch). None (default): in the graph whenever the run was
            trained on the features of a backbone it can rebuild (packaged or file weights); region-feature runs
            and runs on a randomly initialised backbone take features.
        overwrite: replace an existing ``out`` (atomically: the old bundle stays until the new one is complete).
        progress: print one line per stage (and calibration progress) on stderr.
        backbone_weights: the backbone's local weights file, for runs whose features came from one.
        quality_images: images of the held-out set for the task-level checks (0 skips them).

    Returns:
        ``out``.

    Raises:
        FileExistsError: an explicit ``out`` exists and ``overwrite`` is False, or the default ``out`` exists and
            is not a bundle (before any work).
        RunError: no trained run under that name/path.
        BundleExportError: bad arguments, an empty calibration set, or a failed FP32/FP16 parity check (nothing is
            left on disk).
    """
    from edgecap.export import require_onnx_stack

    require_onnx_stack()
    from edgecap.captioning import decode_cfg_for, decoder_for, decoding_overrides
    from edgecap.export import export_onnx

    _check_arguments(int8, calib, target, calib_size, quality_images)
    replacing = False
    if out is None:
        out = default_bundle_out(model_or_run)
        if out.exists() and not overwrite and not is_bundle(out):
            raise FileExistsError(
                f"{out} (the default bundle location) exists and is not a bundle; move it away, pass another "
                "out=/--out, or overwrite=True (--overwrite) to replace it"
            )
        replacing = is_bundle(out)
    out = Path(out)
    if out.exists() and not (overwrite or replacing):
        raise FileExistsError(f"{out} already exists; pass overwrite=True (--overwrite) to replace it")
    calib_images, calib_description = calibration_images(calib) if int8 else ([], "")
    source = load_source(model_or_run, backbone_weights)
    with_backbone = _backbone_in_graph(source, with_backbone)
    needs_backbone = with_backbone or source.backbone_rebuildable
    backbone = source.backbone() if needs_backbone else None
    maker = _InputMaker(source, backbone, with_backbone)
    if int8 and maker.from_images:
        _check_some_image_loads(calib_images, calib_description)  # before the FP32 export, not after it
    requested = {"fp32", *(["fp16"] if fp16 else []), *(["int8"] if int8 else [])}
    precisions = tuple(p for p in PRECISION_ORDER if p in requested and p != _QUANTIZED)  # int8 comes from fp32
    stages = _Stages(3 + int8, progress)
    if replacing:
        stages.note(f"replacing the existing bundle at {out} once the new one is verified")

    with create_bundle(out, overwrite=overwrite or replacing) as bundle:
        inputs = f"pixels in ({backbone.name} in the encoder graph)" if with_backbone else "features in"
        stages(f"exporting {source.name} ({source.origin}) to ONNX, {inputs}: {', '.join(precisions)}, parity vs torch")
        result = export_onnx(
            source.model, None, backbone=backbone if with_backbone else None, name=source.name, precisions=precisions
        )
        failures = _parity_failures(result)
        if failures:
            raise BundleExportError(
                "parity check failed, the exported graphs do not compute what the torch model computes: "
                + " | ".join(failures)
                + ". Nothing was written."
            )
        spec = result.spec
        cfg = decode_cfg_for(
            source.vocab,
            beam_size=source.beam,
            max_words=source.max_words,
            **decoding_overrides(spec.decoding, spec.length_levels),
        )
        variants: dict[str, dict[str, Any]] = {}
        models: dict[str, dict[str, Any]] = {}
        for precision in precisions:
            graphs = {}
            for graph in spec.graph_names:
                name = f"onnx/{precision}/{graph}.onnx"
                bundle.write_model(name, result.model(graph, precision))
                graphs[graph] = name
            variants[precision] = {
                "files": {role: graphs[g] for role, g in spec.runtime_graphs.items()},
                "graphs": graphs,
                "parity": {g: parity_summary(result.get(g, precision).parity) for g in spec.graph_names},
                "parity_passed": True,
            }
            models[precision] = result.runtime_models(precision)
        _write_model_files(bundle, source, with_backbone)

        held_out = None
        if quality_images:
            held_out = _held_out_from_dataset(source, maker, quality_images)
        if int8:
            stages(f"INT8 for {target}: calibration set = {calib_description}")
            held_out = _int8_variant(
                bundle, source, maker, spec, models, variants, cfg, calib_images, calib_description,
                calib_size, target, held_out, quality_images, progress, stages,
            )  # fmt: skip
        stages("task-level check: CIDEr-D and caption agreement vs torch FP32 on the held-out set")
        reference = decoder_for(source.model, "cpu")
        if with_backbone:
            reference = _PixelReference(backbone, reference)
        if held_out is None:
            stages.note(
                "skipped (quality_images=0)"
                if not quality_images
                else "no held-out set: the run's dataset is not reachable and no spare calibration images were given"
            )
        else:
            batches = _torch_batches(held_out.inputs)
            references = held_out.references or _fp32_references(reference, batches, source.vocab, cfg)
            for precision in (p for p in PRECISION_ORDER if p in variants):
                quality = _task_check(reference, models[precision], spec, held_out, references, source.vocab, cfg)
                variants[precision]["quality"] = quality
                stages.note(
                    f"{precision}: CIDEr-D {quality['candidate_cider_d'] * 100:.1f} "
                    f"(FP32 torch {quality['reference_cider_d'] * 100:.1f}), agreement {quality['agreement']:.1%} "
                    f"on {quality['images']} images"
                )
        stages("writing the manifest and verifying the bundle")
        bundle.finalize(
            {
                "model": {
                    "name": source.name,
                    "family": getattr(source.model.cfg, "family", None),
                    "parameters": sum(p.numel() for p in source.model.parameters()),
                },
                "opset": int(spec.opset),
                "interface": {
                    "decode_inputs": list(spec.decode_inputs),
                    "state_names": list(spec.state_names),
                    "updated_state_names": list(spec.step_state_names),
                    "runtime_graphs": dict(spec.runtime_graphs),
                    "decoding": spec.decoding,
                    "length": _length_record(spec),
                    "tokens": spec.tokens_name,
                    "logprobs": spec.logprobs_name,
                    "state_output_suffix": spec.state_output_suffix,
                    "dims": {n: {"min": d.min, "max": d.max} for n, d in spec.dims.items()},
                },
                "backbone_in_graph": with_backbone,
                "held_out": _held_out_record(held_out),
                "variants": variants,
            }
        )
    if replacing:
        log.info("export: replaced the existing bundle at %s", out)
    return out


#: The precision that is quantised from the FP32 graphs rather than exported from torch.
_QUANTIZED = "int8"


def _backbone_in_graph(source: ExportSource, requested: bool | None) -> bool:
    """Whether the encoder graph takes pixels: ``requested``, or by default whenever the backbone can be rebuilt."""
    if requested is False:
        return False
    if not source.backbone_spec:
        if requested:
            raise BundleExportError(
                f"--with-backbone: the {source.origin} was trained on precomputed region features, not on a "
                "backbone's features, so there is no backbone to put in the graph"
            )
        return False
    if not source.backbone_rebuildable:
        if requested:
            raise BundleExportError(
                f"--with-backbone: the {source.origin} was trained on features of a randomly initialised backbone "
                f"({source.backbone_spec.get('name')}), which cannot be rebuilt into a graph; export with "
                "--features-in, or extract features with packaged or file weights"
            )
        return False
    return True


def _length_record(spec: Any) -> dict[str, Any] | None:
    """The manifest's length plan: levels, the level used when a caller gives none, per-level decode defaults."""
    from edgecap.captioning import default_length_level

    if not spec.length_levels:
        return None
    return {
        "levels": [list(p) for p in spec.length_levels],
        "default_level": default_length_level(spec.length_levels),
        **{k: list(v) for k, v in spec.decode_defaults.items()},
    }


def _quantize(spec: Any, fp32_models: Mapping[str, Any], batches: list[Any], cfg: Any, target: str, progress: bool):
    """INT8 graphs of every runtime role: mask-predict graphs are calibrated by decoding every length level."""
    if spec.decoding == "mask_predict":
        from edgecap.calibration.refine import quantize_labert_int8

        return quantize_labert_int8(fp32_models, batches, cfg, target, progress=progress).result(target)
    from edgecap.calibration import quantize_int8

    return quantize_int8(fp32_models, spec, batches, cfg, preset=target, progress=progress)


def _int8_variant(
    bundle: BundleBuilder,
    source: ExportSource,
    maker: _InputMaker,
    spec: Any,
    models: dict[str, dict[str, Any]],
    variants: dict[str, dict[str, Any]],
    cfg: Any,
    calib_images: list[CalibImage],
    calib_description: str,
    calib_size: int,
    target: str,
    held_out: _HeldOut | None,
    quality_images: int,
    progress: bool,
    stages: _Stages,
) -> _HeldOut | None:
    """Calibrate, quantise and write the INT8 variant; returns the held-out set (carved out of the calibration images
    when the run has none)."""
    images = list(calib_images)
    holdout: list[CalibImage] = []
    if held_out is None and quality_images and len(images) >= 2:
        holdout = _sample(images, min(quality_images, max(1, int(len(images) * _HOLDOUT_SHARE))), seed=1)
        kept = set(holdout)
        images = [i for i in images if i not in kept]
    images = _sample(images, calib_size)
    calib_inputs = _calibration_inputs(source, maker, images, progress)
    if not calib_inputs.ids:
        shown = _describe_skipped(calib_inputs.skipped)
        raise BundleExportError(
            f"the calibration set is empty: none of the {len(images)} images of {calib_description} could be used "
            f"({shown})"
        )
    if calib_inputs.skipped:
        first = next(iter(calib_inputs.skipped))
        stages.warn(f"skipped {len(calib_inputs.skipped)} unreadable calibration image(s), e.g. {first}")
    stages.note(f"calibrating on {len(calib_inputs)} images")
    quantized = _quantize(spec, models["fp32"], calib_inputs.batches, cfg, target, progress)
    graphs = {}
    for role, graph in spec.runtime_graphs.items():
        name = f"onnx/int8/{graph}.onnx"
        bundle.write_model(name, quantized.models[role])
        graphs[graph] = name
    ranges_file = "calibration/int8_ranges.json"
    bundle.write_json(ranges_file, {"target": target, **quantized.artifact()})
    calibration = {
        "set": calib_description,
        "images": len(calib_inputs),
        "skipped": len(calib_inputs.skipped),
        "skipped_examples": dict(list(calib_inputs.skipped.items())[:5]),
        "report": dict(quantized.calibration),
    }
    variants["int8"] = {
        "files": {role: graphs[g] for role, g in spec.runtime_graphs.items()},
        "graphs": graphs,
        "target": target,
        "preset": quantized.preset,
        "calibration": calibration,
        "artefacts": {"ranges": ranges_file},
    }
    models["int8"] = dict(quantized.models)
    if held_out is None and holdout:
        inputs = _calibration_inputs(source, maker, holdout, progress=False)
        if inputs.ids:
            held_out = _HeldOut(
                inputs,
                None,
                f"{len(inputs)} calibration images kept out of calibration ({calib_description}); "
                "references = torch FP32 captions",
            )
    return held_out


def _calibration_inputs(
    source: ExportSource, maker: _InputMaker, images: Sequence[CalibImage], progress: bool
) -> _Images:
    if maker.from_images:
        with _progress_bar(len(images), "encoder inputs", progress) as update:
            return maker.images([i.path for i in images], update)
    # A region-feature run: the calibration images must be ones its feature store has features for.
    inputs = maker.stored([i.image_id for i in images])
    if not inputs.ids:
        raise BundleExportError(
            f"the {source.origin} was trained on precomputed region features: INT8 calibration needs images with "
            f"features in {source.features}; pass the run's dataset directory as --calib"
        )
    return inputs


@contextlib.contextmanager
def _progress_bar(total: int, desc: str, enabled: bool) -> Iterator[Callable[[int], Any] | None]:
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=desc, leave=False) as bar:
        yield bar.update
