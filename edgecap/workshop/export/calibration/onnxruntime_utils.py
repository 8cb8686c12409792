"""``onnxruntime.quantization`` plumbing: the version gate, quiet logging, ``quant_pre_process`` and the calibrated
``quantize_static`` call.

Everything that talks to ONNX Runtime's quantiser directly lives here, so the graph and Q/DQ helpers
(``graph_utils``, ``qdq_utils``) and :func:`~edgecap.workshop.export.calibration.int8.quantize_graph` see only ``onnx``
models.
``onnxruntime`` is imported inside the functions: importing this module loads no backend.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.runtime._versions import InvalidVersion, parse_version
from edgecap.workshop.export.calibration.calib_utils import Ranges, progress_bar, ranges_from_cache
from edgecap.workshop.export.calibration.presets import HISTOGRAM_METHODS, QuantPreset
from edgecap.workshop.export.calibration.source import CalibrationError, CalibrationSource, OnnxRuntimeCalibrationReader

__all__ = [
    "MIN_QUANTIZE_ONNXRUNTIME",
    "calibrate_and_quantize",
    "import_quantization",
    "preprocess",
    "quiet_logging",
    "release_numbers",
]

#: The oldest onnxruntime INT8 export is tested with (exported bundles run on >= 1.18).
MIN_QUANTIZE_ONNXRUNTIME = (1, 32)


def release_numbers(version: str) -> tuple[int, ...]:
    """``"1.32.0"`` / ``"1.18.1+cu12"`` / ``"1.33.0rc1"`` -> the release numbers (``(1, 32, 0)``): a nightly or
    local build of a release counts as that release; ``()`` for a string that is not a version."""
    try:
        return parse_version(version).release
    except InvalidVersion:
        return ()


def import_quantization() -> Any:
    """``onnxruntime.quantization``, once the installed onnxruntime is known to quantise what edgecap exports.

    Raises:
        ImportError: onnxruntime is missing, older than :data:`MIN_QUANTIZE_ONNXRUNTIME`, or its ``quantize_static``
            lacks ``calibration_cache_path``.
    """
    try:
        import onnxruntime.quantization as quantization
    except ImportError as exc:
        raise ImportError("INT8 quantisation needs onnxruntime: pip install 'edgecap[cpu]' (or [gpu])") from exc
    import onnxruntime

    if release_numbers(onnxruntime.__version__) < MIN_QUANTIZE_ONNXRUNTIME:
        raise ImportError(
            f"INT8 export needs onnxruntime >= {'.'.join(map(str, MIN_QUANTIZE_ONNXRUNTIME))} (installed: "
            f"{onnxruntime.__version__}; older quant_pre_process fails on graphs with external data, seen with 1.30); "
            "running bundles needs only >= 1.18: upgrade onnxruntime where you export"
        )
    if "calibration_cache_path" not in inspect.signature(quantization.quantize_static).parameters:
        raise ImportError(
            f"onnxruntime {onnxruntime.__version__} is too old: edgecap's INT8 path needs quantize_static("
            "calibration_cache_path=...) (added to onnxruntime in May 2026; present in 1.32): upgrade onnxruntime"
        )
    return quantization


@contextlib.contextmanager
def quiet_logging() -> Iterator[None]:
    """Silence onnxruntime.quantization's root-logger warnings (one per int64 tensor it cannot quantise) without
    letting its ``logging.warning`` calls run ``basicConfig`` on an unconfigured root logger."""
    root = logging.getLogger()
    level, added = root.level, None
    if not root.handlers:
        added = logging.NullHandler()
        root.addHandler(added)
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
        if added is not None:
            root.removeHandler(added)


def preprocess(model: Any, path: Path, what: str) -> tuple[Any, str]:
    """``quant_pre_process`` into ``path``; symbolic shape inference with ``auto_merge`` first, without it on failure
    (the dynamo exporter's shapes are complete already). Returns the model and the mode used."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    attempts = (("symbolic+optimize", {"auto_merge": True}), ("optimize", {"skip_symbolic_shape": True}))
    errors = []
    for mode, options in attempts:
        try:
            with quiet_logging():
                quant_pre_process(model, str(path), **options)
            processed = onnx.load(str(path))
            break
        except Exception as exc:  # symbolic shape inference raises bare Exceptions
            errors.append(f"{mode}: {exc}")
    else:
        raise CalibrationError(f"{what}: quant_pre_process failed: {'; '.join(errors)}")
    before = [i.name for i in model.graph.input], [o.name for o in model.graph.output]
    after = [i.name for i in processed.graph.input], [o.name for o in processed.graph.output]
    if before != after:
        raise CalibrationError(f"{what}: pre-processing changed the graph interface {before} -> {after}")
    return processed, mode


def calibrate_and_quantize(
    tmp: Path,
    preset: QuantPreset,
    policy: Any,
    role: str,
    source: CalibrationSource,
    inputs: Mapping[str, np.dtype],
    length: int | None,
    cached: bytes | None,
    nodes_to_exclude: list[str],
    progress: bool,
) -> tuple[Any, Ranges, str, int]:
    """``quantize_static`` on ``tmp/pre.onnx`` with the range cache in ``tmp``; returns the QDQ model, the ranges,
    onnxruntime's name of the calibration method and the number of feeds read (0 when the cache was reused).

    Raises:
        CalibrationError: the source yields no feed, or onnxruntime fails (a reused cache is named as a likely cause).
    """
    import onnx

    quantization = import_quantization()
    cache_path = tmp / "ranges.json"
    if cached is not None:
        cache_path.write_bytes(cached)
    bar = progress_bar(progress, length, f"int8 {role}: calibrating ({policy.method})")
    reader = OnnxRuntimeCalibrationReader(
        source, list(inputs), inputs, length=length, on_feed=bar.update if bar else None
    )
    kwargs = preset.quantize_kwargs(policy)
    if policy.method in HISTOGRAM_METHODS:
        # one feed per collect pass: bounded memory, and onnxruntime's histogram collector cannot stack feeds of
        # different shapes (it raises "inhomogeneous shape"; MinMax accepts them)
        kwargs["extra_options"]["CalibStridedMinMax"] = 1
    out_path = tmp / "int8.onnx"
    try:
        with quiet_logging(), contextlib.redirect_stdout(io.StringIO()):
            quantization.quantize_static(
                str(tmp / "pre.onnx"),
                str(out_path),
                reader,
                nodes_to_exclude=nodes_to_exclude,
                calibration_providers=["CPUExecutionProvider"],
                calibration_cache_path=str(cache_path),
                **kwargs,
            )
    except CalibrationError:
        raise
    except Exception as exc:  # onnxruntime raises ValueError, RuntimeError, its own Fail/InvalidArgument types
        if cached is None and reader.served == 0:
            raise CalibrationError(f"empty calibration set: {source.name} yielded no feeds") from exc
        hint = f" (the range cache {source.cache} may come from another graph or method: delete it)" if cached else ""
        raise CalibrationError(f"{role}: onnxruntime quantize_static failed: {exc}{hint}") from exc
    finally:
        if bar is not None:
            bar.close()
    if cached is None and reader.served == 0:
        raise CalibrationError(f"empty calibration set: {source.name} yielded no feeds")
    ranges, method = ranges_from_cache(cache_path)
    if cached is None and source.cache is not None:
        source.write_cache(cache_path.read_bytes())
    return onnx.load(str(out_path)), ranges, method, reader.served
