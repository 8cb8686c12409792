"""INT8 calibration and static quantisation (QDQ) of exported captioners.

- :class:`CalibrationSource` (``source``): feeds + a cache path, with the ONNX Runtime calibration-reader adapter.
- ``record``: the decoder-step feeds of a real FP32 decoding run (realistic caches and tokens).
- ``presets``: per-target INT8 schemes (``tensorrt``, ``cpu-avx2``, ``cpu-vnni``, ``arm64``, ``cpu-auto``), and those
  of installed plugins (the ``edgecap.int8_presets`` entry points, docs/extending.md).
- ``quantize``: :func:`quantize_int8` (both runtime graphs), with ONNX Runtime's ``quantize_static`` (the
  ``tensorrt`` preset's QDQ graphs are what ``edgecap engine`` builds from); ``int8``: :func:`quantize_graph` (one
  graph), helped by ``graph_utils`` (inspection, exclusions), ``qdq_utils`` (Q/DQ placement), ``calib_utils`` (level
  feeds, the range cache) and ``onnxruntime_utils`` (``onnxruntime.quantization`` plumbing).
- ``schemes``: the calibration-free ``dynamic`` and ``weight-only`` schemes of a role.
- ``quality``: :func:`compare_decoders`, the task-level check of an INT8 decoder against its FP32 reference.

``onnx``/``onnxruntime`` are imported only when a quantisation actually runs.

    from edgecap.workshop.export.calibration import quantize_int8
    result = quantize_int8(export.runtime_models("fp32"), export.spec, feeds, decode_cfg, preset="cpu-auto")
    result.models["step"]          # QDQ onnx.ModelProto
"""

from __future__ import annotations

from edgecap.runtime._lazy import lazy_dir, lazy_getattr
from edgecap.workshop.export.calibration.presets import (
    QuantPreset,
    RolePolicy,
    detect_cpu_preset,
    get_preset,
    list_presets,
    load_preset_plugins,
    register_preset,
)
from edgecap.workshop.export.calibration.source import (
    CalibrationError,
    CalibrationSource,
    OnnxRuntimeCalibrationReader,
)

_LAZY: dict[str, str] = {
    "FeedRecorder": "edgecap.workshop.export.calibration.record",
    "RecordingStepModel": "edgecap.workshop.export.calibration.record",
    "record_decoder_feeds": "edgecap.workshop.export.calibration.record",
    "GraphInt8": "edgecap.workshop.export.calibration.int8",
    "Int8Result": "edgecap.workshop.export.calibration.quantize",
    "quantize_graph": "edgecap.workshop.export.calibration.int8",
    "quantize_int8": "edgecap.workshop.export.calibration.quantize",
    "compare_decoders": "edgecap.workshop.export.calibration.quality",
}

__all__ = [
    "CalibrationError",
    "CalibrationSource",
    "OnnxRuntimeCalibrationReader",
    "QuantPreset",
    "RolePolicy",
    "detect_cpu_preset",
    "get_preset",
    "list_presets",
    "load_preset_plugins",
    "register_preset",
    *_LAZY,
]


__getattr__ = lazy_getattr(__name__, _LAZY)
__dir__ = lazy_dir(globals(), _LAZY)
