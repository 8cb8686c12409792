"""The INT8 variant: calibrate on the calibration images, quantise for the target preset, write the QDQ graphs and
the calibration ranges (TensorRT builds from the QDQ graphs: no calibration table), and return the manifest's record
of it."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecap.workshop.export.bundling import BundleExportError
from edgecap.workshop.export.bundling.console import Stages
from edgecap.workshop.export.bundling.images import CalibImage, InputMaker, calibration_inputs, describe_skipped, sample
from edgecap.workshop.export.bundling.selection import Int8Selector
from edgecap.workshop.export.bundling.source import ExportSource
from edgecap.workshop.export.writer import BundleBuilder

__all__ = ["Int8Job", "Int8Variant", "build_int8_variant", "scheme_records"]


@dataclass(frozen=True)
class Int8Job:
    """What INT8 calibration of one export needs.

    Attributes:
        source, maker: the exported model and the maker of its encoder inputs.
        spec: the export spec (graph roles, decoding).
        fp32_models: role -> FP32 ONNX model, the graphs that are quantised.
        cfg: the decode config (mask-predict graphs are calibrated by decoding).
        images, description: the calibration images (held-out ones already removed) and how the manifest names them.
        calib_size: calibrate on at most this many (a seeded sample spread over ``images``).
        target: the INT8 preset name.
        progress: show progress bars.
        step_scheme: a name of ``STEP_SCHEMES`` for the decoder's loop graph, or None for the preset's own.
        selector: accuracy-aware INT8 (``bundling.selection``): keep the fewest layers float that meet its target;
            None: every layer the preset quantises is INT8.
    """

    source: ExportSource
    maker: InputMaker
    spec: Any
    fp32_models: Mapping[str, Any]
    cfg: Any
    images: Sequence[CalibImage]
    description: str
    calib_size: int
    target: str
    progress: bool
    step_scheme: str | None = None
    selector: Int8Selector | None = None

    def preset(self) -> Any:
        """The target preset, with the requested step scheme on the loop role (``step``, LaBERT's ``refine``)."""
        from edgecap.workshop.export.calibration.presets import get_preset

        preset = get_preset(self.target)
        if self.step_scheme is None:
            return preset
        return preset.with_step_scheme(self.step_scheme, "refine" if self.spec.decoding == "mask_predict" else "step")


@dataclass(frozen=True)
class Int8Variant:
    """The written INT8 variant: its manifest record and its quantised models by runtime role."""

    record: dict[str, Any]
    models: dict[str, Any]


_QDQ_KEYS = {"QuantizeLinear": "quantize_linear", "DequantizeLinear": "dequantize_linear"}


def scheme_records(calibration: Mapping[str, Any], roles: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per runtime role, how its INT8 graph was quantised, for the manifest: ``scheme``, ``bits``, the weight-only
    block options and the integer ops in the graph (``quantized_ops``), from the calibration report."""
    reports = calibration.get("roles") or calibration.get("graphs") or {}
    keys = ("scheme", "bits", "block_size", "accuracy_level")
    out = {}
    for role in roles:
        report = reports.get(role, {})
        out[role] = {
            **{"scheme": "static", "bits": 8},
            **{k: report[k] for k in keys if k in report},
            "ops": dict(report.get("quantized_ops", {})),
        }
        if out[role]["scheme"] == "static":
            out[role]["qdq"] = {op: report.get(key, 0) for op, key in _QDQ_KEYS.items()}
    return out


def _quantize(job: Int8Job, batches: list[Any], workdir: Path | None) -> Any:
    """INT8 graphs of every runtime role: mask-predict graphs are calibrated by decoding every length level."""
    if job.spec.decoding == "mask_predict":
        from edgecap.workshop.export.calibration.refine import quantize_labert_int8

        return quantize_labert_int8(
            job.fp32_models, batches, job.cfg, job.preset(), progress=job.progress, workdir=workdir
        ).result(job.target)
    from edgecap.workshop.export.calibration import quantize_int8

    return quantize_int8(
        job.fp32_models, job.spec, batches, job.cfg, preset=job.preset(), progress=job.progress, workdir=workdir
    )


def _quantize_and_select(job: Int8Job, batches: list[Any], stages: Stages) -> tuple[Any, dict[str, Any] | None]:
    """The quantisation result (its models with the selected layers in float) and the ``selection`` record; the
    pre-processed FP32 graphs the selection restores float inputs from are kept in a temporary directory."""
    if job.selector is None:
        return _quantize(job, batches, None), None
    import onnx

    with tempfile.TemporaryDirectory(prefix="edgecap-int8-select-") as tmp:
        quantized = _quantize(job, batches, Path(tmp))
        preset = job.preset()
        reports = quantized.calibration.get("roles") or quantized.calibration.get("graphs") or {}
        static = [role for role in quantized.models if preset.role(role).scheme == "static"]
        originals = {role: onnx.load(str(Path(tmp) / f"{role}.fp32-pre.onnx")) for role in static}
    op_types = {role: tuple(reports.get(role, {}).get("op_types") or preset.role(role).op_types) for role in static}
    models, record = job.selector.select(job.fp32_models, quantized.models, originals, op_types, batches, stages)
    quantized.models = models
    return quantized, record


def build_int8_variant(bundle: BundleBuilder, job: Int8Job, stages: Stages) -> Int8Variant:
    """Calibrate, quantise and write the INT8 graphs and calibration artefacts into ``bundle``.

    Raises:
        BundleExportError: none of the calibration images could be turned into encoder inputs.
    """
    from edgecap.workshop.export.calibration.presets import get_preset

    images = sample(list(job.images), job.calib_size)
    inputs = calibration_inputs(job.source, job.maker, images, job.progress)
    if not inputs.ids:
        raise BundleExportError(
            f"the calibration set is empty: none of the {len(images)} images of {job.description} could be used "
            f"({describe_skipped(inputs.skipped)})"
        )
    if inputs.skipped:
        first = next(iter(inputs.skipped))
        stages.warn(f"skipped {len(inputs.skipped)} unreadable calibration image(s), e.g. {first}")
    stages.note(f"calibrating on {len(inputs)} images")
    quantized, selection = _quantize_and_select(job, inputs.batches, stages)
    spec = job.spec
    graphs = {}
    for role, graph in spec.runtime_graphs.items():
        name = f"onnx/int8/{graph}.onnx"
        bundle.write_model(name, quantized.models[role])
        graphs[graph] = name
    ranges_file = "calibration/int8_ranges.json"
    bundle.write_json(ranges_file, {"target": job.target, **quantized.artifact()})
    calibration = {
        "set": job.description,
        "images": len(inputs),
        "skipped": len(inputs.skipped),
        "skipped_examples": dict(list(inputs.skipped.items())[:5]),
        "report": dict(quantized.calibration),
    }
    record = {
        "files": {role: graphs[g] for role, g in spec.runtime_graphs.items()},
        "graphs": graphs,
        "target": job.target,
        "preset": quantized.preset,
        "deployment": get_preset(quantized.preset).deployment(),
        "schemes": scheme_records(quantized.calibration, spec.runtime_graphs),
        "calibration": calibration,
        "artefacts": {"ranges": ranges_file},
    }
    if selection is not None:
        record["selection"] = selection
        _count_selected_ops(record["schemes"], quantized.models, selection)
    return Int8Variant(record, dict(quantized.models))


def _count_selected_ops(
    schemes: dict[str, dict[str, Any]], models: Mapping[str, Any], selection: Mapping[str, Any]
) -> None:
    """Re-count the integer ops and Q/DQ nodes of the static roles after layers went back to float (the calibration
    report counted the fully quantised graphs), and stamp each graph with its float-layer count."""
    from edgecap.workshop.export.calibration.qdq_utils import qdq_summary
    from edgecap.workshop.export.graph import set_metadata

    kept = [str(entry["layer"]).split(":", 1)[0] for entry in selection.get("kept_float", [])]
    for role, record in schemes.items():
        if record.get("scheme") != "static" or role not in models:
            continue
        summary = qdq_summary(models[role], list(record["ops"]) or ("MatMul", "Gemm", "Conv"))
        record["ops"] = summary["quantized_ops"]
        record["qdq"] = {"QuantizeLinear": summary["quantize_linear"], "DequantizeLinear": summary["dequantize_linear"]}
        set_metadata(models[role], {"int8_float_layers": str(kept.count(role))})
