"""Static INT8 quantisation of a captioner's runtime graphs to QDQ ONNX with ONNX Runtime's own quantiser.

:func:`quantize_int8` takes the FP32 runtime graphs (``{"encoder": init graph, "step": step graph}``), the caller's
encoder feeds (real images: backbone pixels or region features) and the deployed :class:`DecodeCfg`, then

1. decodes the calibration images with the FP32 graphs on ONNX Runtime, recording the step graph's feeds (tokens,
   cross-attention keys/values and the growing self-attention cache) — realistic decoder calibration data
   (``edgecap.workshop.export.calibration.record``);
2. per graph (:func:`~edgecap.workshop.export.calibration.int8.quantize_graph`): ``quant_pre_process`` (symbolic shape
inference,
   basic ONNX Runtime optimisation, ONNX shape inference), then ``quantize_static(QuantFormat.QDQ)`` with the target
   preset's types, op types and calibration method (``edgecap.workshop.export.calibration.presets``), excluding the
   nodes/op types
   the caller names;
3. returns the QDQ graphs, the calibration tensor ranges (JSON-ready) and a calibration report for the bundle
   manifest. TensorRT builds from the QDQ graphs themselves (explicit INT8; ``edgecap engine``), so no TensorRT
   calibration table is written.

A length-controllable model (``*-len``, LaBERT §3.1: its encoder graph takes ``length_level``) is calibrated at every
level: feeds without levels get one per image, cycling over the plan, and each image is decoded at its own level.

Each feed is checked against the graph's inputs; an empty calibration set, a set from which decoding records no step
feed, or mismatching names raise :class:`~edgecap.workshop.export.calibration.source.CalibrationError` before any
quantisation runs.

This is the entry point of the INT8 path; its parts sit beside it: ``int8`` (one graph), ``graph_utils`` (graph
inspection, exclusions), ``qdq_utils`` (Q/DQ placement), ``calib_utils`` (level feeds, the range cache) and
``onnxruntime_utils`` (``onnxruntime.quantization`` plumbing). :class:`GraphInt8`, :func:`quantize_graph` and
:func:`graph_inputs` are importable from here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.runtime._io import atomic_write_json
from edgecap.workshop.export.calibration.calib_utils import LENGTH_LEVEL, Ranges, progress_bar, with_levels
from edgecap.workshop.export.calibration.graph_utils import check_exclusions, for_role, graph_inputs, split_role
from edgecap.workshop.export.calibration.int8 import GraphInt8, quantize_graph
from edgecap.workshop.export.calibration.presets import AUTO, QuantPreset, get_preset
from edgecap.workshop.export.calibration.record import FeedRecorder, record_decoder_feeds
from edgecap.workshop.export.calibration.source import CalibrationError, CalibrationSource, as_source, check_feed_names

__all__ = [
    "DECODER_FEED_BYTES",
    "DECODER_ROWS_PER_FEED",
    "GraphInt8",
    "Int8Result",
    "graph_inputs",
    "quantize_graph",
    "quantize_int8",
]

#: Memory bound of the recorded decoder feeds: at most this many hypotheses per step feed, and this many bytes in all.
#: A step row of acort-xsmall at 49 regions holds ~50 KB of cross-attention keys plus its cache, so 512 beam-search
#: feeds of 12 rows would need ~300 MB; 8 rows and 256 MiB keep calibration on a laptop.
DECODER_ROWS_PER_FEED = 8
DECODER_FEED_BYTES = 256 << 20


@dataclasses.dataclass
class Int8Result:
    """What :func:`quantize_int8` produced.

    Attributes:
        models: graph role -> QDQ ``onnx.ModelProto`` (same roles as the FP32 input).
        preset: the preset used (``cpu-auto`` resolved, e.g. ``"cpu-vnni"``).
        calibration: JSON-ready report: feed counts, methods, per-role quantised op counts, excluded nodes, the
            decoder-feed recording statistics and the preset's settings.
        ranges: role -> tensor -> (lowest, highest) calibrated values (the calibration artefact).
    """

    models: dict[str, Any]
    preset: str
    calibration: dict[str, Any]
    ranges: dict[str, Ranges] = dataclasses.field(default_factory=dict)

    def artifact(self) -> dict[str, Any]:
        """JSON-ready calibration artefact for a bundle: preset, report and ranges (tuples as 2-element lists)."""
        return {
            "preset": self.preset,
            "calibration": self.calibration,
            "ranges": {role: {k: [lo, hi] for k, (lo, hi) in r.items()} for role, r in self.ranges.items()},
        }


def quantize_int8(
    fp32_models: Mapping[str, Any],
    spec: Any,
    encoder_feeds: Iterable[Mapping[str, np.ndarray]],
    decode_cfg: Any,
    preset: str | QuantPreset = AUTO,
    *,
    max_decoder_feeds: int = 512,
    exclude_nodes: Sequence[str] = (),
    exclude_op_types: Sequence[str] = (),
    workdir: Path | None = None,
    progress: bool = True,
) -> Int8Result:
    """INT8 versions of a captioner's runtime graphs, calibrated on real images.

    Each role is quantised with its preset policy's scheme: the encoder with calibrated static QDQ, the step with
    static QDQ, ``dynamic`` or ``weight-only`` (``edgecap.workshop.export.calibration.schemes``, no calibration;
    docs/int8.md).

    Args:
        fp32_models: ``{"encoder": ..., "step": ...}`` FP32 runtime graphs (``ExportResult.runtime_models("fp32")``).
        spec: the model's ``ExportSpec`` (state names, token/log-prob names, state output suffix).
        encoder_feeds: batches of encoder-graph inputs from real calibration images (e.g. ``{"pixel_values"}`` or
            ``{"features", "boxes", "feature_mask"}``); the set size is the caller's choice (a few hundred images
            is typical). A list, a re-iterable or a callable is streamed twice; a generator is kept in memory. For a
            length-controllable model a feed may hold ``length_level`` (B,); without it, levels cycle over the plan.
        decode_cfg: the deployed ``DecodeCfg``; the FP32 graphs decode the calibration images with it and the step
            feeds of that decoding calibrate the step graph (a length-controllable model: at each feed's levels).
        preset: target preset name (``tensorrt``, ``cpu-avx2``, ``cpu-vnni``, ``arm64``, ``cpu-auto``) or a
            :class:`QuantPreset`.
        max_decoder_feeds: cap on recorded step feeds (a uniform sample of all steps beyond it; each feed keeps at
            most :data:`DECODER_ROWS_PER_FEED` hypotheses, and all of them at most :data:`DECODER_FEED_BYTES`).
        exclude_nodes: node names or globs kept float; prefix ``"encoder:"``/``"step:"`` to target one graph.
        exclude_op_types: op types kept float (optionally role-prefixed, e.g. ``"step:Gemm"``).
        workdir: also keep the pre-processed FP32 graphs, the QDQ graphs, the range files and the calibration report
            here (None: nothing is written).
        progress: show progress bars.

    Raises:
        CalibrationError: no encoder feeds, no decoder feed recorded, feed names not matching the graph inputs,
            exclusion patterns matching nothing, or quantisation failing.
    """
    from edgecap.runtime.backends.bridge import RuntimeStepModel
    from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeSession

    roles = list(fp32_models)
    missing = [r for r in ("encoder", "step") if r not in fp32_models]
    if missing:
        raise CalibrationError(f"fp32_models lacks role(s) {missing} (got {roles}); pass ExportResult.runtime_models()")
    extra = [r for r in roles if r not in ("encoder", "step")]
    if extra:
        raise CalibrationError(
            f"quantize_int8 quantises the encoder and step graphs; quantise {extra} with quantize_graph"
        )
    resolved = get_preset(preset)
    check_exclusions(fp32_models, list(exclude_nodes))
    encoder_inputs = graph_inputs(fp32_models["encoder"])
    step_inputs = graph_inputs(fp32_models["step"])
    expected_step = [spec.tokens_name, *spec.state_names]
    check_feed_names(dict.fromkeys(step_inputs), expected_step, "the step graph vs spec.tokens_name/state_names")

    levels = len(getattr(spec, "length_levels", ()) or ()) if LENGTH_LEVEL in encoder_inputs else 0
    if levels:  # each image at the level its feed carries (decode would otherwise force one level on all)
        decode_cfg = decode_cfg.replace(length_level=None)
    source = as_source(encoder_feeds, "encoder calibration feeds")
    # Only a static (QDQ) step is calibrated on recorded step inputs; a dynamic or weight-only step reads none, so the
    # FP32 decode of every calibration image that records them is skipped.
    step_static = resolved.role("step").scheme == "static"
    bar = None
    if step_static:
        bar = progress_bar(progress, source.length_hint(), "int8: decoding calibration images (fp32)")
    if levels:
        source = with_levels(source, levels)
    kept: list[dict[str, np.ndarray]] | None = None if source.reiterable else []
    recorder = FeedRecorder(max_feeds=max_decoder_feeds, max_rows=DECODER_ROWS_PER_FEED, max_bytes=DECODER_FEED_BYTES)

    def checked(feeds: CalibrationSource) -> Iterator[dict[str, np.ndarray]]:
        for index, feed in enumerate(feeds):
            check_feed_names(feed, list(encoder_inputs), f"{feeds.name} #{index}")
            yield {k: v.astype(encoder_inputs[k], copy=False) for k, v in feed.items()}

    def on_batch(index: int, batch: dict[str, np.ndarray]) -> None:
        if kept is not None:
            kept.append({k: np.array(v, copy=True) for k, v in batch.items()})
        if bar is not None:
            bar.update()

    if step_static:
        step_model = RuntimeStepModel(
            OnnxRuntimeSession(fp32_models["encoder"], name="fp32-encoder", providers="cpu"),
            OnnxRuntimeSession(fp32_models["step"], name="fp32-step", providers="cpu"),
            spec.state_names,
            tokens_name=spec.tokens_name,
            logprobs_name=spec.logprobs_name,
            state_output_names=spec.state_output_names,
            updated_state_names=spec.step_state_names,
        )
        try:
            with step_model:
                record_decoder_feeds(
                    step_model,
                    CalibrationSource(lambda: checked(source), name=source.name),
                    decode_cfg,
                    spec.state_names,
                    recorder=recorder,
                    tokens_name=spec.tokens_name,
                    token_dtype=step_inputs[spec.tokens_name],
                    on_batch=on_batch,
                )
        finally:
            if bar is not None:
                bar.close()
        images = source.count or 0
        encoder_source = CalibrationSource(kept, source.cache, name=source.name) if kept is not None else source
    else:
        images = 0
        once = source if source.reiterable else source.materialize()
        encoder_source = CalibrationSource(lambda: checked(once), source.cache, name=source.name)

    root = Path(workdir) if workdir is not None else None
    results: dict[str, GraphInt8] = {}
    for role, feeds in (("encoder", encoder_source), ("step", recorder.source("decoder step feeds"))):
        results[role] = quantize_graph(
            fp32_models[role],
            feeds,
            resolved,
            role,
            exclude_nodes=for_role(exclude_nodes, role, roles),
            exclude_op_types=for_role(exclude_op_types, role, roles),
            strict_exclusions=False,
            workdir=root,
            progress=progress,
        )

    lost = [
        item
        for item in exclude_nodes
        if all(
            split_role(item, roles)[1] in results[r].info["unmatched_exclusions"]
            for r in results
            if split_role(item, roles)[0] in (None, r)
        )
    ]
    if not step_static:
        images = encoder_source.count or 0
    if lost:  # matched the FP32 graph, but pre-processing renamed or fused those nodes
        raise CalibrationError(f"exclude_nodes pattern(s) {lost} match no node of the pre-processed graphs")
    calibration = {
        "preset": resolved.name,
        "preset_requested": preset if isinstance(preset, str) else resolved.name,
        "quant_format": {role: "QDQ" if resolved.role(role).scheme == "static" else "QOperator" for role in results},
        "encoder_feeds": images,
        "decoder_feeds": len(recorder),
        "decoder_recording": {**recorder.stats(), "decode_strategy": getattr(decode_cfg, "strategy", None)},
        "roles": {role: r.info for role, r in results.items()},
        "settings": resolved.summary(),
    }
    if root is not None:
        atomic_write_json(root / "int8_calibration.json", calibration)
    return Int8Result(
        models={role: r.model for role, r in results.items()},
        preset=resolved.name,
        calibration=calibration,
        ranges={role: r.ranges for role, r in results.items()},
    )
