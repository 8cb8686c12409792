"""INT8 for LaBERT's graphs (``encoder`` + ``refine``), calibrated like the autoregressive ones: the ``refine`` feeds
are recorded while the FP32 graphs run mask-predict on the calibration images at every length level, so the
quantiser sees the token/level mixtures (all-[MASK] first pass, partly masked later passes) that deployment sees.

Each graph goes through :func:`~edgecap.workshop.export.calibration.int8.quantize_graph` with the preset's policy of the
matching
role: ``encoder`` for the visual embedding, ``refine`` for the refine graph (a preset without a ``refine`` policy uses
its default role, static QDQ: a refine pass runs every position at once, not one token per weight read).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.runtime.decoding import DecodeCfg, decode
from edgecap.runtime.decoding.arrays import to_numpy
from edgecap.workshop.export.calibration.int8 import GraphInt8, quantize_graph
from edgecap.workshop.export.calibration.presets import QuantPreset
from edgecap.workshop.export.calibration.quantize import Int8Result
from edgecap.workshop.export.calibration.source import CalibrationError

__all__ = ["LabertInt8", "RecordingRefineModel", "quantize_labert_int8"]


class RecordingRefineModel:
    """Wraps a :class:`~edgecap.runtime.decoding.mask_predict.RefineModel` and keeps a copy of every ``refine`` feed."""

    def __init__(self, inner: Any, state_names: Sequence[str], max_feeds: int = 256) -> None:
        self.inner, self.state_names, self.max_feeds = inner, tuple(state_names), max_feeds
        self.length_levels, self.refine_steps = inner.length_levels, inner.refine_steps
        self.eos_decay, self.mask_id = inner.eos_decay, inner.mask_id
        self.feeds: list[dict[str, np.ndarray]] = []
        self.calls = 0

    def encode(self, inputs: Mapping[str, Any]) -> Any:
        return self.inner.encode(inputs)

    def refine(self, tokens: np.ndarray, length_level: np.ndarray, state: Any) -> Any:
        self.calls += 1
        if len(self.feeds) < self.max_feeds:
            feed = {"tokens": np.array(to_numpy(tokens)), "length_level": np.array(to_numpy(length_level))}
            feed.update((n, np.array(to_numpy(state[n]))) for n in self.state_names)
            self.feeds.append(feed)
        return self.inner.refine(tokens, length_level, state)


@dataclass
class LabertInt8:
    """The QDQ graphs (``{"encoder", "refine"}``) and their calibration reports."""

    models: dict[str, Any]
    graphs: dict[str, GraphInt8] = field(default_factory=dict)

    @property
    def info(self) -> dict[str, Any]:
        return {role: g.info for role, g in self.graphs.items()}

    def result(self, preset: str) -> Int8Result:
        """The same graphs as an :class:`~edgecap.workshop.export.calibration.quantize.Int8Result`, the form a bundle's
        INT8 variant
        is written from (models, ranges per role, the calibration report)."""
        from edgecap.workshop.export.calibration.presets import get_preset

        return Int8Result(
            models=dict(self.models),
            preset=get_preset(preset).name,
            calibration={"preset": get_preset(preset).name, "preset_requested": preset, "graphs": self.info},
            ranges={role: dict(g.ranges) for role, g in self.graphs.items()},
        )


def quantize_labert_int8(
    fp32_models: Mapping[str, Any],
    encoder_feeds: Iterable[Mapping[str, Any]],
    decode_cfg: DecodeCfg,
    preset: str | QuantPreset = "cpu-auto",
    *,
    max_refine_feeds: int = 256,
    progress: bool = False,
    workdir: Path | None = None,
) -> LabertInt8:
    """Quantise LaBERT's FP32 ``encoder`` and ``refine`` graphs to INT8.

    Args:
        fp32_models: ``ExportResult.runtime_models("fp32")`` of a LaBERT export.
        encoder_feeds: batches of visual inputs (``features``, ``boxes``, ``feature_mask``) from real images.
        decode_cfg: a mask-predict config (token ids; ``length_level`` is overridden: every level is decoded).
        preset: an ``edgecap.workshop.export.calibration.presets`` name or a :class:`QuantPreset`.
        max_refine_feeds: cap on recorded ``refine`` feeds (the first ones, spread over levels and batches).
        workdir: also keep each role's pre-processed FP32 graph, QDQ graph and ranges here (``quantize_graph``).

    Raises:
        CalibrationError: no encoder feeds, or the graphs are not LaBERT's.
    """
    from edgecap.runtime.backends.onnxruntime.refine import create_onnxruntime_refine_model

    missing = [r for r in ("encoder", "refine") if r not in fp32_models]
    if missing:
        raise CalibrationError(f"quantize_labert_int8 needs the encoder and refine graphs; missing {missing}")
    batches = [dict(b) for b in encoder_feeds]
    if not batches:
        raise CalibrationError("no calibration images: encoder_feeds is empty")
    with create_onnxruntime_refine_model(fp32_models["encoder"], fp32_models["refine"], providers="cpu") as fp32:
        per_level = max(1, max_refine_feeds // len(fp32.length_levels))
        feeds: list[dict[str, np.ndarray]] = []
        for level in range(1, len(fp32.length_levels) + 1):
            recorder = RecordingRefineModel(fp32, fp32.state_names, per_level)
            for batch in batches:
                decode(recorder, batch, decode_cfg.replace(strategy="mask_predict", length_level=level))
            feeds.extend(recorder.feeds)
    encoder = [{k: np.asarray(v) for k, v in b.items()} for b in batches]
    graphs = {
        "encoder": quantize_graph(
            fp32_models["encoder"], encoder, preset, role="encoder", workdir=workdir, progress=progress
        ),
        # its own role: a refine pass runs every position at once (not a one-token step), static QDQ by default
        "refine": quantize_graph(
            fp32_models["refine"], feeds, preset, role="refine", workdir=workdir, progress=progress
        ),
    }
    return LabertInt8({role: g.model for role, g in graphs.items()}, graphs)
