"""Calibration data around a quantisation run: feeds with length levels, the tensor-range cache, progress.

- :func:`with_levels`: the encoder feeds of a length-controllable model (``*-len``, LaBERT §3.1), each image given
  a ``length_level`` so that every level of the plan is calibrated.
- :func:`read_range_cache` / :func:`ranges_from_cache`: ONNX Runtime's JSON tensor-range cache
  (``quantize_static(calibration_cache_path=...)``): checked before reuse, read back as ``(lowest, highest)`` per
  tensor for the bundle's calibration artefact.
- :func:`progress_bar`: the optional bar over calibration feeds or images.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.workshop.export.calibration.source import CalibrationError, CalibrationSource

__all__ = ["LENGTH_LEVEL", "Ranges", "progress_bar", "ranges_from_cache", "read_range_cache", "with_levels"]

#: Ranges of one graph: tensor name -> (lowest, highest) calibrated value.
Ranges = dict[str, tuple[float, float]]
#: The encoder input of a length-controllable model (``edgecap.workshop.export.specs.captioning.LEVEL_INPUT``).
LENGTH_LEVEL = "length_level"


def with_levels(source: CalibrationSource, levels: int) -> CalibrationSource:
    """``source`` whose feeds without ``length_level`` get (B,) int64 1-based levels cycling over ``1..levels`` from
    the feed's index, so that every level is calibrated whatever the batch size."""

    def feeds() -> Iterator[dict[str, np.ndarray]]:
        for index, feed in enumerate(source):
            if LENGTH_LEVEL in feed:
                yield feed
            else:
                batch = int(next(iter(feed.values())).shape[0])
                yield {**feed, LENGTH_LEVEL: ((np.arange(batch) + index) % levels + 1).astype(np.int64)}

    return CalibrationSource(feeds if source.reiterable else feeds(), source.cache, name=source.name)


def read_range_cache(source: CalibrationSource) -> bytes | None:
    """The bytes of ``source``'s range cache, or None when it has none yet.

    Raises:
        CalibrationError: the file is not an ONNX Runtime tensor-range cache (e.g. a TensorRT calibration table).
    """
    data = source.read_cache()
    if data is None:
        return None
    try:
        parsed = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        parsed = None
    if not isinstance(parsed, dict) or "data" not in parsed or "calibration_method" not in parsed:
        raise CalibrationError(
            f"calibration cache {source.cache} is not an ONNX Runtime tensor-range cache (JSON with 'data' and "
            "'calibration_method'); a TensorRT calibration table cannot be reused here — delete it or use another path"
        )
    return data


def ranges_from_cache(path: Path) -> tuple[Ranges, str]:
    """The ranges in an ONNX Runtime range cache (sorted by tensor name) and the calibration method that wrote it."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    data = load_tensors_data(path)
    ranges: Ranges = {}
    for name in data:
        lowest, highest = data[name].range_value
        ranges[name] = (float(np.min(lowest)), float(np.max(highest)))
    method = getattr(data.calibration_method, "name", str(data.calibration_method))
    return dict(sorted(ranges.items())), method


def progress_bar(enabled: bool, total: int | None, desc: str) -> Any:
    """A progress bar over ``total`` steps, or None when ``enabled`` is false."""
    if not enabled:
        return None
    from edgecap.workshop._progress import ProgressBar

    return ProgressBar(total, desc)
