"""``export_bundle``: a trained run (or a bundle) -> a verified bundle with FP32 (+ FP16, + INT8) graphs.

A run trained on a backbone's features gets a pixels-in bundle by default: the backbone is inside the encoder graph
(input ``pixel_values``) at every precision, so an edge device captions images with ONNX Runtime alone and INT8
covers the backbone's convolutions too. Region-feature runs (and runs on a randomly initialised backbone, which
cannot be rebuilt) take features. Without ``out`` the bundle goes to ``$EDGECAP_HOME/bundles/NAME``.

Stages, all inside one temporary directory that is renamed onto ``out`` only when everything passed
(:func:`~edgecap.workshop.export.writer.create_bundle`; a bundle already there stays until then):

1. export the model's graphs with :func:`edgecap.workshop.export.export_onnx`; every graph's element-wise parity against
   torch must pass at every precision, else the export fails and leaves nothing;
2. write config, vocab, weights (and the backbone's local weights file when the run used one);
3. INT8 (``int8=True``): turn the calibration images into encoder feeds (backbone features computed by the run's
   backbone, or preprocessed pixels when the backbone is in the graph), quantise with
   :func:`edgecap.workshop.export.calibration.quantize_int8` for ``target``, write the QDQ graphs and the ranges
   (TensorRT builds
   from the QDQ graphs: no calibration table);
4. task-level check of every variant against the torch FP32 model on a held-out set: CIDEr-D of both, the
   difference, and caption agreement (``edgecap.workshop.export.calibration.compare_decoders``). The held-out set is the
   run's
   val split when its dataset is reachable, else calibration images kept out of calibration (scored against the
   FP32 captions); the manifest names the set and its size;
5. the manifest (checksums, versions, parity, quality), then a full verification with the reader.

Each stage is a module of :mod:`edgecap.workshop.export.bundling`; this module runs them in order
(:func:`export_request`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

from edgecap.runtime._io import check_output_location, output_lock
from edgecap.runtime.bundle.layout import is_bundle
from edgecap.runtime.bundle.manifest import PRECISION_ORDER
from edgecap.runtime.images.load import IMAGE_SUFFIXES
from edgecap.workshop.export.bundling import BundleExportError
from edgecap.workshop.export.bundling import quality as _quality
from edgecap.workshop.export.bundling.compression import compression_record, reference_source
from edgecap.workshop.export.bundling.console import Stages
from edgecap.workshop.export.bundling.held_out import (
    HeldOut,
    carve_held_out,
    held_out_from_calibration,
    held_out_from_dataset,
    held_out_record,
)
from edgecap.workshop.export.bundling.images import CalibImage, InputMaker, calibration_images, check_some_image_loads
from edgecap.workshop.export.bundling.int8 import Int8Job, build_int8_variant
from edgecap.workshop.export.bundling.request import (
    DEFAULT_CALIB_SIZE,
    DEFAULT_QUALITY_IMAGES,
    QUANTIZED,
    ExportRequest,
    int8_targets,
)
from edgecap.workshop.export.bundling.selection import DEFAULT_RANKING_IMAGES, Int8Selector
from edgecap.workshop.export.bundling.source import ExportSource, backbone_in_graph, default_bundle_out, load_source
from edgecap.workshop.export.bundling.variants import (
    check_parity,
    interface_record,
    write_float_variants,
    write_model_files,
)
from edgecap.workshop.export.writer import create_bundle

__all__ = [
    "DEFAULT_CALIB_SIZE",
    "DEFAULT_QUALITY_IMAGES",
    "IMAGE_SUFFIXES",
    "BundleExportError",
    "CalibImage",
    "ExportRequest",
    "ExportSource",
    "calibration_images",
    "default_bundle_out",
    "export_bundle",
    "export_request",
    "int8_targets",
    "load_source",
]

log = logging.getLogger(__name__)


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
    int8_step: str | None = None,
    max_cider_drop: float | None = None,
    min_agreement: float | None = None,
    ranking_images: int = DEFAULT_RANKING_IMAGES,
) -> Path:
    """Export a trained run to a verified bundle directory (FP32 always; FP16 and INT8 on request).

    Args:
        model_or_run: a model name trained earlier (``$EDGECAP_HOME/runs/NAME``), a run directory, a
            :class:`~edgecap.workshop.runs.TrainedRun`, or a bundle (re-export from its weights).
        out: the bundle directory to create. Default :func:`default_bundle_out` (``$EDGECAP_HOME/bundles/NAME``),
            where an existing bundle is replaced without ``overwrite``: the new one is built beside it, verified,
            then swapped in atomically.
        fp16: also export float16 graphs (for GPUs/NPUs; slower than FP32 on ONNX Runtime's CPU provider).
        int8: also write INT8 (QDQ) graphs calibrated on ``calib``.
        calib: a folder of images (searched recursively; unreadable files are skipped and counted) or a dataset
            directory (its train split images).
        target: INT8 preset, one of :func:`int8_targets` (the registered presets, which
            ``edgecap.workshop.export.calibration.register_preset`` extends, and ``cpu-auto`` for this machine's CPU).
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
        int8_step: how the decoder step (LaBERT: refine) graph is quantised, a name of
            ``edgecap.workshop.export.calibration.presets.STEP_SCHEMES`` (``static``, ``dynamic``, ``weight-only``,
            ``weight-only-4``); None: the target preset's scheme (docs/int8.md).
        max_cider_drop: accuracy-aware INT8: at most this many CIDEr-D points (0-100 scale) below the torch FP32
            model on the held-out set; the fewest most-sensitive layers stay float until it holds
            (:mod:`edgecap.workshop.export.calibration.sensitivity`, docs/int8.md). None: not a target.
        min_agreement: accuracy-aware INT8: at least this fraction (0-1) of held-out captions identical to FP32's.
        ranking_images: calibration images the layers are ranked on (leave-one-out, one decode per layer).

    Returns:
        ``out``.

    Raises:
        FileExistsError: an explicit ``out`` exists and ``overwrite`` is False, or the default ``out`` exists and
            is not a bundle (before any work), or another process is exporting to ``out``.
        edgecap.runtime._io.OutputLocationError: ``out`` cannot be written (read-only, a name too long, a file in the
        way),
            checked before any work.
        RunError: no trained run under that name/path.
        BundleExportError: bad arguments, an empty calibration set, a failed FP32/FP16 parity check, or an accuracy
            target INT8 cannot meet even with every ranked layer in float (nothing is left on disk).
    """
    request = ExportRequest(
        fp16=fp16,
        int8=int8,
        calib=None if calib is None else Path(calib),
        target=target,
        calib_size=calib_size,
        with_backbone=with_backbone,
        overwrite=overwrite,
        progress=progress,
        backbone_weights=None if backbone_weights is None else Path(backbone_weights),
        quality_images=quality_images,
        int8_step=int8_step,
        max_cider_drop=max_cider_drop,
        min_agreement=min_agreement,
        ranking_images=ranking_images,
    )
    return export_request(model_or_run, out, request)


def _resolve_out(model_or_run: Any, out: str | Path | None, overwrite: bool) -> tuple[Path, bool]:
    """``(out, replacing)``: the bundle directory, and whether an existing bundle at the default location is replaced;
    the location is checked before any work (writable, a name the filesystem takes)."""
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
    check_output_location(out, existing="replace" if overwrite or replacing else "refuse", what="bundle out")
    return out, replacing


def export_request(model_or_run: Any, out: str | Path | None, request: ExportRequest) -> Path:
    """:func:`export_bundle` with its options as one :class:`ExportRequest` (the stages, in order)."""
    from edgecap.workshop.export import require_onnx_stack

    require_onnx_stack()
    out, replacing = _resolve_out(model_or_run, out, request.overwrite)
    with output_lock(out):  # a second export to the same place fails now, not after its work
        return _export_to(model_or_run, out, replacing, request)


def _export_to(model_or_run: Any, out: Path, replacing: bool, request: ExportRequest) -> Path:
    from edgecap.runtime.captioning import decode_cfg_for, decoding_overrides
    from edgecap.workshop.export import export_onnx
    from edgecap.workshop.torch_runtime.captioning import decoder_for

    calib_images, calib_description = (
        calibration_images(cast(Path, request.calib)) if request.int8 else ([], "")  # int8 requires calib
    )
    source = load_source(model_or_run, request.backbone_weights)
    with_backbone = backbone_in_graph(source, request.with_backbone)
    backbone = source.backbone() if with_backbone or source.backbone_rebuildable else None
    maker = InputMaker(source, backbone, with_backbone)
    if request.int8 and maker.from_images:
        check_some_image_loads(calib_images, calib_description)  # before the FP32 export, not after it
    precisions = request.precisions(PRECISION_ORDER)
    stages = Stages(3 + request.int8, request.progress)
    if replacing:
        stages.note(f"replacing the existing bundle at {out} once the new one is verified")

    with create_bundle(out, overwrite=request.overwrite or replacing) as bundle:
        inputs = f"pixels in ({cast(Any, backbone).name} in the encoder graph)" if with_backbone else "features in"
        stages(f"exporting {source.name} ({source.origin}) to ONNX, {inputs}: {', '.join(precisions)}, parity vs torch")
        result = export_onnx(
            source.model, None, backbone=backbone if with_backbone else None, name=source.name, precisions=precisions
        )
        check_parity(result)
        spec = result.spec
        cfg = decode_cfg_for(
            source.vocab,
            beam_size=source.beam,
            max_words=source.max_words,
            **decoding_overrides(spec.decoding, spec.length_levels),
        )
        variants, models = write_float_variants(bundle, result, precisions)
        write_model_files(bundle, source, with_backbone)

        held_out = held_out_from_dataset(source, maker, request.quality_images) if request.quality_images else None
        images, holdout = carve_held_out(calib_images, request.quality_images if held_out is None else 0)
        if request.int8:
            held_out = held_out or held_out_from_calibration(source, maker, holdout, calib_description)
        reference_model, reference_label, parent = reference_source(source, request.backbone_weights, load_source)
        reference = decoder_for(reference_model, "cpu")
        if with_backbone:  # the parent's own backbone when it differs (QAT tunes it): built above otherwise
            tuned = parent is not None and parent.backbone_spec and parent.backbone_spec != source.backbone_spec
            reference = _quality.PixelReference(parent.backbone() if tuned else cast(Any, backbone), reference)
        references = (
            None if held_out is None else _quality.held_out_references(reference, held_out, source.vocab, cfg, spec)
        )
        if request.int8:
            stages(f"INT8 for {request.target}: calibration set = {calib_description}")
            job = Int8Job(
                source=source,
                maker=maker,
                spec=spec,
                fp32_models=models["fp32"],
                cfg=cfg,
                images=images,
                description=calib_description,
                calib_size=request.calib_size,
                target=request.target,
                progress=request.progress,
                step_scheme=request.int8_step,
                selector=_selector(request, reference, spec, held_out, references, source, cfg, backbone),
            )
            int8 = build_int8_variant(bundle, job, stages)
            variants[QUANTIZED], models[QUANTIZED] = int8.record, int8.models
        stages(f"task-level check: CIDEr-D and caption agreement vs {reference_label} on the held-out set")
        if held_out is None or references is None:
            stages.note(
                "skipped (quality_images=0)"
                if not request.quality_images
                else "no held-out set: the run's dataset is not reachable and no spare calibration images were given"
            )
        else:
            _check_variants(reference, models, variants, spec, held_out, references, source.vocab, cfg, stages)
            for variant in variants.values():
                variant["quality"]["reference"] = reference_label
        stages("writing the manifest and verifying the bundle")
        bundle.finalize(
            {
                "model": {
                    "name": source.name,
                    "family": getattr(source.model.cfg, "family", None),
                    "parameters": sum(p.numel() for p in source.model.parameters()),
                },
                "opset": int(spec.opset),
                "interface": interface_record(spec),
                "backbone_in_graph": with_backbone,
                "held_out": held_out_record(held_out),
                "variants": variants,
                **({"compression": compression} if (compression := compression_record(source.compression)) else {}),
            }
        )
    if replacing:
        log.info("export: replaced the existing bundle at %s", out)
    return out


def _check_variants(
    reference: Any,
    models: dict[str, dict[str, Any]],
    variants: dict[str, dict[str, Any]],
    spec: Any,
    held_out: HeldOut,
    references: Any,
    vocab: Any,
    cfg: Any,
    stages: Stages,
) -> None:
    """Record each variant's task-level check in its manifest entry, and print it (``references``: per checked
    length level, :func:`~edgecap.workshop.export.bundling.quality.held_out_references`)."""
    for precision in (p for p in PRECISION_ORDER if p in variants):
        quality = _quality.task_check(
            reference, models[precision], spec, held_out, references, vocab, cfg, variants[precision].get("schemes")
        )
        variants[precision]["quality"] = quality
        stages.note(
            f"{precision}: CIDEr-D {quality['candidate_cider_d'] * 100:.1f} "
            f"(FP32 torch {quality['reference_cider_d'] * 100:.1f}), agreement {quality['agreement']:.1%} "
            f"on {quality['images']} images"
        )


def _selector(
    request: ExportRequest,
    reference: Any,
    spec: Any,
    held_out: HeldOut | None,
    references: Any,
    source: ExportSource,
    cfg: Any,
    backbone: Any,
) -> Int8Selector | None:
    """Accuracy-aware INT8's settings (None without a target): its held-out check is the task-level check the
    manifest records, so a selection that passes here is recorded as passing."""
    target = request.int8_target()
    if target is None:
        return None
    if held_out is None:
        raise BundleExportError(
            "accuracy-aware INT8 (--max-cider-drop/--min-agreement) needs a held-out set: the run's dataset is not "
            "reachable and the calibration set has too few images to keep some out"
        )
    from edgecap.workshop.export.calibration.layers import param_index

    named = list(source.model.named_parameters())
    if backbone is not None:
        named += [(f"backbone.{n}", p) for n, p in backbone.named_parameters()]

    def check(models: Any) -> dict[str, Any]:
        return _quality.task_check(reference, models, spec, held_out, references, source.vocab, cfg)

    return Int8Selector(
        target, check, spec, cfg, source.vocab, param_index(named), ranking_images=request.ranking_images
    )
