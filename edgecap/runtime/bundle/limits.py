"""The bounds on every number a bundle records, checked when ``manifest.json`` and ``config.json`` are read.

A bundle is input like any other: a hand-edited or hostile ``max_words`` of 10^9 would make decoding run for ever,
an ``image_size`` of 10^6 would make preprocessing allocate tens of gigabytes, a zero ``std`` would divide every
pixel by zero. Each limit is far above what any exported model uses (224/384 px backbones, captions of 8–25 words,
batches of 1024) and far below what exhausts an edge board; ``docs/contracts.md`` lists them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from edgecap.runtime.decoding.config import MAX_BEAM

__all__ = [
    "MAX_BEAM",
    "MAX_DIM",
    "MAX_FEATURE_DIM",
    "MAX_FILE_BYTES",
    "MAX_GRID",
    "MAX_IMAGE_SIZE",
    "MAX_LENGTH_LEVELS",
    "MAX_OPSET",
    "MAX_REFINE_STEPS",
    "MAX_VOCAB_SIZE",
    "MAX_WORDS",
    "MIN_IMAGE_SIZE",
    "check_config_numbers",
    "check_int",
    "check_length_plan",
    "check_manifest_numbers",
    "check_number",
]

#: Longest caption a bundle may ask for (``config.json`` ``decode.max_words``; length levels' upper ends).
MAX_WORDS = 256
#: Backbone input side in pixels (``backbone.image_size``); the lower bound is ``PreprocessCfg``'s.
MIN_IMAGE_SIZE = 16
MAX_IMAGE_SIZE = 4096
#: Output classes of a vocabulary (``model.vocab_size``, ``vocab.size``).
MAX_VOCAB_SIZE = 1 << 20
#: Width of a feature vector (``model.feature_dim``, ``backbone.feature_dim``).
MAX_FEATURE_DIM = 1 << 16
#: Each side of a backbone's feature grid (``backbone.grid``).
MAX_GRID = MAX_IMAGE_SIZE
#: Upper end of a dynamic graph dimension (``interface.dims``: batch, images, regions, past, length) and of an
#: engine profile's dimensions; exports use 1024 rows and regions.
MAX_DIM = 1 << 16
#: Length levels of a length-controllable model (``interface.length.levels``; LaBERT has 4).
MAX_LENGTH_LEVELS = 64
#: Mask-predict refinement passes per level (``interface.length.refine_steps``; LaBERT uses 10–25).
MAX_REFINE_STEPS = 1000
#: The ONNX opset a manifest records (``opset``).
MAX_OPSET = 1000
#: A listed file's size in bytes (``files[*].bytes``): what a file system can hold.
MAX_FILE_BYTES = (1 << 63) - 1


def check_int(value: Any, where: str, low: int, high: int, error: type[Exception]) -> int:
    """``value`` if it is an integer (not a bool) in ``[low, high]``, else ``error`` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{where} must be an integer in {low}..{high}, got {value!r}")
    if not low <= value <= high:
        raise error(f"{where} is {value}, outside the limit {low}..{high}")
    return value


def check_number(
    value: Any,
    where: str,
    error: type[Exception],
    low: float = -math.inf,
    high: float = math.inf,
    positive: bool = False,
) -> float:
    """``value`` if it is a finite number in ``[low, high]`` (and > 0 when ``positive``), else ``error``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{where} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise error(f"{where} must be finite, got {value!r}")
    if positive and value <= 0:
        raise error(f"{where} must be positive, got {value!r}")
    if not low <= value <= high:
        raise error(f"{where} is {value}, outside {low}..{high}")
    return float(value)


def _triple(value: Any, where: str, error: type[Exception], positive: bool) -> None:
    if not isinstance(value, list) or len(value) != 3:
        raise error(f"{where} must be a list of 3 numbers (one per RGB channel), got {value!r}")
    for i, v in enumerate(value):
        check_number(v, f"{where}[{i}]", error, positive=positive)


def check_backbone_numbers(spec: Mapping[str, Any], where: str, error: type[Exception]) -> None:
    """The preprocessing a backbone spec records; fields absent from older bundles are left to their defaults."""
    if "image_size" not in spec:
        raise error(f"{where}.image_size is missing")
    check_int(spec["image_size"], f"{where}.image_size", MIN_IMAGE_SIZE, MAX_IMAGE_SIZE, error)
    if "mean" in spec:
        _triple(spec["mean"], f"{where}.mean", error, positive=False)
    if "std" in spec:  # pixels are divided by it
        _triple(spec["std"], f"{where}.std", error, positive=True)
    if "crop_pct" in spec:
        check_number(spec["crop_pct"], f"{where}.crop_pct", error, high=2.0, positive=True)
    if spec.get("feature_dim") is not None:
        check_int(spec["feature_dim"], f"{where}.feature_dim", 1, MAX_FEATURE_DIM, error)
    grid = spec.get("grid")
    if grid is not None:
        if not isinstance(grid, list) or len(grid) != 2:
            raise error(f"{where}.grid must be [height, width], got {grid!r}")
        for i, side in enumerate(grid):
            check_int(side, f"{where}.grid[{i}]", 1, MAX_GRID, error)
    from edgecap.runtime.images.preprocess import PreprocessCfg  # Pillow, needed only by bundles with a backbone

    if all(key in spec for key in PreprocessCfg.SPEC_FIELDS):  # its own rules: interpolation, crop mode
        try:
            PreprocessCfg.from_spec(spec)
        except (ValueError, TypeError) as exc:
            raise error(f"{where}: {exc}") from None


def check_config_numbers(config: Mapping[str, Any], where: str, error: type[Exception]) -> None:
    """Every number of a bundle's ``config.json`` the runtimes read (types already checked by the reader)."""
    model, decode = config["model"], config["decode"]
    check_int(model["vocab_size"], f"{where}: model.vocab_size", 1, MAX_VOCAB_SIZE, error)
    if model.get("feature_dim") is not None:
        check_int(model["feature_dim"], f"{where}: model.feature_dim", 1, MAX_FEATURE_DIM, error)
    check_int(config["vocab"]["size"], f"{where}: vocab.size", 1, MAX_VOCAB_SIZE, error)
    check_int(decode["max_words"], f"{where}: decode.max_words", 1, MAX_WORDS, error)
    check_int(decode["beam"], f"{where}: decode.beam", 1, MAX_BEAM, error)
    if config.get("backbone"):
        check_backbone_numbers(config["backbone"], f"{where}: backbone", error)


def _check_dims(dims: Any, where: str, error: type[Exception]) -> None:
    if not isinstance(dims, dict):
        raise error(f"{where} must map each dimension to {{'min', 'max'}}, got {type(dims).__name__}")
    for name, entry in dims.items():
        if not isinstance(entry, dict):
            raise error(f"{where}[{name!r}] must be an object with 'min' and 'max'")
        low = check_int(entry.get("min"), f"{where}[{name!r}].min", 0, MAX_DIM, error)
        check_int(entry.get("max"), f"{where}[{name!r}].max", low, MAX_DIM, error)


def check_length_plan(levels: Any, refine_steps: Any, eos_decay: Any, where: str, error: type[Exception]) -> None:
    """A length plan (the manifest's ``interface.length``, a refine graph's metadata): at most
    :data:`MAX_LENGTH_LEVELS` ``[low, high]`` word ranges within :data:`MAX_WORDS`, refinement passes within
    :data:`MAX_REFINE_STEPS` and finite non-negative EOS decays (None: not recorded)."""
    if not isinstance(levels, (list, tuple)) or len(levels) > MAX_LENGTH_LEVELS:
        raise error(f"{where}.levels must be a list of at most {MAX_LENGTH_LEVELS} [low, high] word ranges")
    for i, level in enumerate(levels):
        if not isinstance(level, (list, tuple)) or len(level) != 2:
            raise error(f"{where}.levels[{i}] must be [low, high], got {level!r}")
        low = check_int(level[0], f"{where}.levels[{i}][0]", 1, MAX_WORDS, error)
        check_int(level[1], f"{where}.levels[{i}][1]", low, MAX_WORDS, error)
    for key, values, check in (
        ("refine_steps", refine_steps, lambda v, w: check_int(v, w, 1, MAX_REFINE_STEPS, error)),
        ("eos_decay", eos_decay, lambda v, w: check_number(v, w, error, low=0.0)),
    ):
        if values is None:
            continue
        if not isinstance(values, (list, tuple)) or len(values) > MAX_LENGTH_LEVELS:
            raise error(f"{where}.{key} must be a list of at most {MAX_LENGTH_LEVELS} numbers (one per level)")
        for i, value in enumerate(values):
            check(value, f"{where}.{key}[{i}]")


def _check_length(record: Any, where: str, error: type[Exception]) -> None:
    if not isinstance(record, dict):
        raise error(f"{where} must be null or an object with 'levels', got {type(record).__name__}")
    levels = record.get("levels", [])
    check_length_plan(levels, record.get("refine_steps"), record.get("eos_decay"), where, error)
    if record.get("default_level") is not None:
        check_int(record["default_level"], f"{where}.default_level", 1, max(len(levels), 1), error)


def check_manifest_numbers(manifest: Mapping[str, Any], where: str, error: type[Exception]) -> None:
    """Every number of a manifest a reader acts on: opset, file sizes, graph dimensions, length levels (types of
    the enclosing objects already checked by :func:`~edgecap.runtime.bundle.manifest.parse_manifest`)."""
    check_int(manifest["opset"], f"{where}: opset", 1, MAX_OPSET, error)
    for name, entry in manifest["files"].items():
        check_int(entry.get("bytes"), f"{where}: files[{name!r}].bytes", 0, MAX_FILE_BYTES, error)
    interface = manifest["interface"]
    if interface.get("dims") is not None:
        _check_dims(interface["dims"], f"{where}: interface.dims", error)
    if interface.get("length") is not None:
        _check_length(interface["length"], f"{where}: interface.length", error)
