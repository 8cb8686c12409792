"""Precision -> TensorRT network and builder settings, per TensorRT version (10.3, JetPack 6's, through 11).

Precision lives in the bundle's graphs: FP16 engines build from the FP16 graphs (FP16 initialisers and casts, with
the ops export keeps in FP32), INT8 engines from the INT8 graphs' explicit Q/DQ nodes. No implicit-INT8 calibrator
is used anywhere: TensorRT 10.1 deprecated it and 11 removed it.

- TensorRT 11: every network is strongly typed (the ``STRONGLY_TYPED`` creation flag is accepted and ignored, the
  precision builder flags no longer exist). Nothing to set: the graph's types are the engine's.
- TensorRT 10.12 and later 10.x: weak typing is deprecated; networks are created ``STRONGLY_TYPED``.
- TensorRT 10.0 - 10.11 (10.3 is JetPack 6's): FP32 and FP16 graphs build strongly typed, so the ops export kept in
  FP32 stay FP32 exactly as in ONNX Runtime. INT8 Q/DQ graphs build weakly typed with ``BuilderFlag.INT8`` (Q/DQ
  layers need it in weak typing) and ``BuilderFlag.FP16`` (the layers between Q/DQ pairs may run in FP16), the way
  ONNX Runtime's TensorRT execution provider builds them when INT8 is on.

``typing="strong"`` or ``"weak"`` overrides the choice where the installed TensorRT allows it. Every decision is made
from attributes of the ``tensorrt`` module passed in, so it is tested with a stand-in module on machines without
TensorRT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgecap.runtime._versions import InvalidVersion, parse_version
from edgecap.runtime.precisions import PRECISIONS

__all__ = [
    "ENGINE_PRECISIONS",
    "SPARSE_WEIGHTS",
    "MIN_TRT",
    "BuildSettings",
    "EngineSettingsError",
    "build_settings",
    "records_2to4",
    "trt_version",
    "with_sparse_weights",
]

#: Precisions an engine can be built at (each from the bundle's graphs of that precision): every bundle precision.
ENGINE_PRECISIONS = PRECISIONS
#: The oldest TensorRT edgecap builds with (JetPack 6).
MIN_TRT = (10, 3)
#: First 10.x release where weak typing is deprecated (strong typing is then the default choice for every precision).
_STRONG_DEFAULT = (10, 12)
_TYPINGS = ("auto", "strong", "weak")


#: The builder flag that lets TensorRT pick sparse tensor-core kernels for weights with 2:4 structure (Ampere+).
SPARSE_WEIGHTS = "SPARSE_WEIGHTS"


class EngineSettingsError(ValueError):
    """A precision, typing or TensorRT version edgecap cannot build an engine with."""


def trt_version(trt: Any) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a ``tensorrt`` module (``__version__`` such as ``"10.3.0.30"``)."""
    text = str(getattr(trt, "__version__", ""))
    try:
        numbers = parse_version(text).release
    except InvalidVersion:
        numbers = ()
    if len(numbers) < 2:
        raise EngineSettingsError(f"cannot read the TensorRT version from {text!r}")
    major, minor, patch = (*numbers, 0)[:3]
    return major, minor, patch


@dataclass(frozen=True)
class BuildSettings:
    """What an engine build sets, resolved for one TensorRT version.

    Attributes:
        precision: the graphs' precision.
        strongly_typed: whether the network is strongly typed.
        network_flags: the bit mask for ``Builder.create_network``.
        builder_flags: names of ``tensorrt.BuilderFlag`` members to set (in strong typing only ``SPARSE_WEIGHTS``,
            which :func:`with_sparse_weights` adds).
        reason: one line for reports.
    """

    precision: str
    strongly_typed: bool
    network_flags: int
    builder_flags: tuple[str, ...]
    reason: str

    def apply(self, trt: Any, config: Any) -> None:
        """Set :attr:`builder_flags` on an ``IBuilderConfig``."""
        for name in self.builder_flags:
            config.set_flag(getattr(trt.BuilderFlag, name))


def build_settings(trt: Any, precision: str, typing: str = "auto") -> BuildSettings:
    """The network/builder settings for ``precision`` on the installed TensorRT (see the module docstring).

    Args:
        trt: the ``tensorrt`` module (or a stand-in exposing ``__version__``, ``NetworkDefinitionCreationFlag`` and
            ``BuilderFlag``).
        precision: ``"fp32"``, ``"fp16"`` or ``"int8"``.
        typing: ``"auto"``, ``"strong"`` or ``"weak"``.

    Raises:
        EngineSettingsError: an unknown precision or typing, a TensorRT older than 10.3, or a typing this TensorRT
            does not have (weak typing on 11, strong typing without the creation flag).
    """
    if precision not in ENGINE_PRECISIONS:
        raise EngineSettingsError(f"precision must be one of {list(ENGINE_PRECISIONS)}, got {precision!r}")
    if typing not in _TYPINGS:
        raise EngineSettingsError(f"typing must be one of {list(_TYPINGS)}, got {typing!r}")
    version = trt_version(trt)
    shown = ".".join(map(str, version))
    if version[:2] < MIN_TRT:
        raise EngineSettingsError(
            f"TensorRT {shown} is older than {'.'.join(map(str, MIN_TRT))} (JetPack 6), the oldest edgecap builds with"
        )
    creation = getattr(trt, "NetworkDefinitionCreationFlag", None)
    strong_flag = getattr(creation, "STRONGLY_TYPED", None) if creation is not None else None
    builder_flag = getattr(trt, "BuilderFlag", None)
    has_weak = builder_flag is not None and hasattr(builder_flag, "FP16") and hasattr(builder_flag, "INT8")
    if version[0] >= 11 or not has_weak:
        if typing == "weak":
            raise EngineSettingsError(f"TensorRT {shown} has no weak typing (removed in 11): use typing='strong'")
        network_flags = 1 << int(strong_flag) if strong_flag is not None else 0
        return BuildSettings(precision, True, network_flags, (), f"TensorRT {shown}: strongly typed (the only mode)")
    if typing == "strong" or (typing == "auto" and (precision != "int8" or version[:2] >= _STRONG_DEFAULT)):
        if strong_flag is None:
            raise EngineSettingsError(f"TensorRT {shown} has no NetworkDefinitionCreationFlag.STRONGLY_TYPED")
        why = "requested" if typing == "strong" else (
            "weak typing is deprecated from 10.12" if version[:2] >= _STRONG_DEFAULT
            else f"{precision.upper()} graph types kept exactly"
        )  # fmt: skip
        return BuildSettings(precision, True, 1 << int(strong_flag), (), f"TensorRT {shown}: strongly typed ({why})")
    flags = {"fp32": (), "fp16": ("FP16",), "int8": ("INT8", "FP16")}[precision]
    why = "requested" if typing == "weak" else "explicit Q/DQ INT8 with builder flags, as 10.x before 10.12 builds it"
    return BuildSettings(precision, False, 0, flags, f"TensorRT {shown}: weakly typed, flags {list(flags)} ({why})")


def records_2to4(manifest: Any) -> bool:
    """Whether a bundle manifest records 2:4 sparse weights (``compression.steps`` holds a ``sparsity`` step with
    pattern 2:4, written at export from the run's ``edgecap prune --sparsity 2:4`` record). Bundles without the
    optional ``compression`` object: False."""
    compression = manifest.get("compression") if isinstance(manifest, dict) else None
    steps = compression.get("steps") if isinstance(compression, dict) else None
    return any(
        isinstance(step, dict) and step.get("kind") == "sparsity" and step.get("pattern", "2:4") == "2:4"
        for step in (steps if isinstance(steps, list) else [])
    )


def with_sparse_weights(trt: Any, settings: BuildSettings) -> BuildSettings:
    """``settings`` plus ``BuilderFlag.SPARSE_WEIGHTS``: TensorRT then times sparse tensor-core kernels for the
    constant weights that have 2:4 structure along K and keeps them where faster (a request, not a promise: layers
    without the structure, or where the dense kernel wins, stay dense). It is not a precision flag, so strongly
    typed networks take it too.

    Raises:
        EngineSettingsError: this TensorRT has no ``SPARSE_WEIGHTS`` flag.
    """
    builder_flag = getattr(trt, "BuilderFlag", None)
    if builder_flag is None or not hasattr(builder_flag, SPARSE_WEIGHTS):
        raise EngineSettingsError(f"TensorRT {getattr(trt, '__version__', '?')} has no BuilderFlag.SPARSE_WEIGHTS")
    if SPARSE_WEIGHTS in settings.builder_flags:
        return settings
    return BuildSettings(
        settings.precision,
        settings.strongly_typed,
        settings.network_flags,
        (*settings.builder_flags, SPARSE_WEIGHTS),
        f"{settings.reason}; sparse weights (2:4)",
    )
