"""The float variants' files and the manifest records derived from the export: the bundle config, parity
failures, the FP32/FP16 variant entries and the interface block."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgecap.runtime.bundle.layout import CONFIG_NAME, VOCAB_NAME, WEIGHTS_NAME
from edgecap.workshop.export.bundling import BundleExportError
from edgecap.workshop.export.bundling.source import ExportSource
from edgecap.workshop.export.parity import parity_summary
from edgecap.workshop.export.writer import BundleBuilder

__all__ = ["check_parity", "interface_record", "write_float_variants", "write_model_files"]


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


def write_model_files(bundle: BundleBuilder, source: ExportSource, with_backbone: bool) -> None:
    from edgecap.workshop.training.checkpoint import save_weights

    backbone_file = None
    if source.backbone_source == "file" and source.backbone_weights is not None:
        backbone_file = f"backbone/{source.backbone_weights.name}"
        bundle.copy_file(source.backbone_weights, backbone_file)
    bundle.write_json(CONFIG_NAME, _bundle_config(source, with_backbone, backbone_file))
    source.vocab.save(bundle.path(VOCAB_NAME))
    save_weights(source.model, bundle.path(WEIGHTS_NAME))


def _length_record(spec: Any) -> dict[str, Any] | None:
    """The manifest's length plan: levels, the level used when a caller gives none, per-level decode defaults."""
    from edgecap.runtime.captioning import default_length_level

    if not spec.length_levels:
        return None
    return {
        "levels": [list(p) for p in spec.length_levels],
        "default_level": default_length_level(spec.length_levels),
        **{k: list(v) for k, v in spec.decode_defaults.items()},
    }


def check_parity(result: Any) -> None:
    """Refuse an export whose graphs do not compute what the torch model computes (at any precision)."""
    failures = _parity_failures(result)
    if failures:
        raise BundleExportError(
            "parity check failed, the exported graphs do not compute what the torch model computes: "
            + " | ".join(failures)
            + ". Nothing was written."
        )


def write_float_variants(
    bundle: BundleBuilder, result: Any, precisions: Sequence[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Write each exported precision's graphs; returns ``(manifest variant records, role -> model per precision)``."""
    spec = result.spec
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
    return variants, models


def interface_record(spec: Any) -> dict[str, Any]:
    """The manifest's ``interface`` block: what a runtime feeds and reads, from the export spec."""
    return {
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
    }
