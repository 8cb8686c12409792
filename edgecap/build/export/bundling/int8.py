"""The INT8 variant: calibrate on the calibration images, quantise for the target preset, write the QDQ graphs and
the calibration ranges (TensorRT builds from the QDQ graphs: no calibration table), and return the manifest's record
of it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgecap.build.export.bundling import BundleExportError
from edgecap.build.export.bundling.console import Stages
from edgecap.build.export.bundling.images import CalibImage, InputMaker, calibration_inputs, describe_skipped, sample
from edgecap.build.export.bundling.source import ExportSource
from edgecap.build.export.writer import BundleBuilder

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

    def preset(self) -> Any:
        """The target preset, with the requested step scheme on the loop role (``step``, LaBERT's ``refine``)."""
        from edgecap.build.export.calibration.presets import get_preset

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


def _quantize(job: Int8Job, batches: list[Any]) -> Any:
    """INT8 graphs of every runtime role: mask-predict graphs are calibrated by decoding every length level."""
    if job.spec.decoding == "mask_predict":
        from edgecap.build.export.calibration.refine import quantize_labert_int8

        return quantize_labert_int8(job.fp32_models, batches, job.cfg, job.preset(), progress=job.progress).result(
            job.target
        )
    from edgecap.build.export.calibration import quantize_int8

    return quantize_int8(job.fp32_models, job.spec, batches, job.cfg, preset=job.preset(), progress=job.progress)


def build_int8_variant(bundle: BundleBuilder, job: Int8Job, stages: Stages) -> Int8Variant:
    """Calibrate, quantise and write the INT8 graphs and calibration artefacts into ``bundle``.

    Raises:
        BundleExportError: none of the calibration images could be turned into encoder inputs.
    """
    from edgecap.build.export.calibration.presets import get_preset

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
    quantized = _quantize(job, inputs.batches)
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
    return Int8Variant(record, dict(quantized.models))
