"""An export's options as one frozen, validated value (what ``export_bundle``'s keyword arguments say)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecap.workshop.export.bundling import BundleExportError

__all__ = ["DEFAULT_CALIB_SIZE", "DEFAULT_QUALITY_IMAGES", "ExportRequest", "int8_targets"]

DEFAULT_CALIB_SIZE = 256
DEFAULT_QUALITY_IMAGES = 100
#: Calibration images accuracy-aware INT8 ranks layers on (``bundling.selection`` uses the same default).
DEFAULT_RANKING_IMAGES = 32
#: The precision that is quantised from the FP32 graphs rather than exported from torch.
QUANTIZED = "int8"


def int8_targets() -> list[str]:
    """The INT8 targets export accepts: the registered ``edgecap.workshop.export.calibration`` presets
    (``register_preset`` adds
    one) plus ``cpu-auto``, which picks the preset for the exporting machine's CPU."""
    from edgecap.workshop.export.calibration.presets import list_presets

    return list_presets()


@dataclass(frozen=True)
class ExportRequest:
    """What to export besides the model: see :func:`edgecap.workshop.export.bundle.export_bundle` for each field.

    Raises:
        BundleExportError: an unknown INT8 target, ``int8`` without ``calib`` (or the reverse), a non-positive
            ``calib_size`` or a negative ``quality_images``.
    """

    fp16: bool = False
    int8: bool = False
    calib: Path | None = None
    target: str = "cpu-auto"
    calib_size: int = DEFAULT_CALIB_SIZE
    with_backbone: bool | None = None
    overwrite: bool = False
    progress: bool = True
    backbone_weights: Path | None = None
    quality_images: int = DEFAULT_QUALITY_IMAGES
    int8_step: str | None = None
    max_cider_drop: float | None = None
    min_agreement: float | None = None
    ranking_images: int = DEFAULT_RANKING_IMAGES

    def __post_init__(self) -> None:
        from edgecap.workshop.export.calibration.presets import STEP_SCHEMES

        targets = int8_targets()
        if self.target not in targets:
            raise BundleExportError(f"unknown INT8 target {self.target!r}; choose one of {targets}")
        if self.int8_step is not None and self.int8_step not in STEP_SCHEMES:
            raise BundleExportError(f"unknown INT8 step scheme {self.int8_step!r}; choose one of {list(STEP_SCHEMES)}")
        if self.int8_step is not None and not self.int8:
            raise BundleExportError("int8_step= is only used for INT8: pass int8=True (--int8) or drop it")
        if self.int8_step is not None:  # a scheme the target cannot run fails now, not after the FP32 export
            from edgecap.workshop.export.calibration import CalibrationError, get_preset

            try:
                get_preset(self.target).with_step_scheme(self.int8_step)
            except CalibrationError as exc:
                raise BundleExportError(f"--int8-step {self.int8_step} with --target {self.target}: {exc}") from exc
        if self.int8 and self.calib is None:
            raise BundleExportError("INT8 export needs calibration images: pass calib=DIR (--calib DIR)")
        if self.calib is not None and not self.int8:
            raise BundleExportError("calib= is only used for INT8: pass int8=True (--int8) or drop it")
        if self.calib_size < 1:
            raise BundleExportError(f"calib_size must be >= 1, got {self.calib_size}")
        if self.quality_images < 0:
            raise BundleExportError(f"quality_images must be >= 0, got {self.quality_images}")
        self.int8_target()  # range checks
        if self.accuracy_aware and not self.int8:
            raise BundleExportError("max_cider_drop=/min_agreement= select INT8 layers: pass int8=True (--int8)")
        if self.accuracy_aware and not self.quality_images:
            raise BundleExportError(
                "max_cider_drop=/min_agreement= are checked on the held-out set: quality_images must be > 0"
            )
        if self.ranking_images < 1:
            raise BundleExportError(f"ranking_images must be >= 1, got {self.ranking_images}")

    @property
    def accuracy_aware(self) -> bool:
        """Whether INT8 keeps the fewest layers float that meet a quality target (``bundling.selection``)."""
        return self.max_cider_drop is not None or self.min_agreement is not None

    def int8_target(self) -> Any:
        """The :class:`~edgecap.workshop.export.calibration.sensitivity.Int8Target`, or None without one.

        Raises:
            BundleExportError: a value out of its range.
        """
        if not self.accuracy_aware:
            return None
        from edgecap.workshop.export.calibration.sensitivity import Int8Target, TargetError

        try:
            return Int8Target(self.max_cider_drop, self.min_agreement)
        except TargetError as exc:
            raise BundleExportError(str(exc)) from exc

    def precisions(self, order: tuple[str, ...]) -> tuple[str, ...]:
        """The precisions exported from torch, in ``order`` (INT8 is quantised from FP32 afterwards)."""
        requested = {"fp32", *(["fp16"] if self.fp16 else []), *([QUANTIZED] if self.int8 else [])}
        return tuple(p for p in order if p in requested and p != QUANTIZED)
