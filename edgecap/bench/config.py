"""``BenchCfg``: what ``edgecap bench`` measures and how, checked when it is made (a bad field fails before any
bundle is opened, naming the field), and the length levels each bundle is measured at.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from edgecap.bench import harness
from edgecap.bench.harness import LoopCfg
from edgecap.runtime.backends.registry import STEP_MODES
from edgecap.runtime.backends.threads import ThreadSettingError, check_threads
from edgecap.runtime.decoding.config import MAX_BEAM
from edgecap.runtime.length import NO_LENGTH_CONTROL, LengthLevelError
from edgecap.runtime.precisions import PRECISIONS

__all__ = ["ALL_LEVELS", "STEP_MODE_CHOICES", "BenchCfg", "BenchCfgError"]

#: ``BenchCfg.length_levels`` value meaning every level of each bundle's plan.
ALL_LEVELS = "all"


#: ``BenchCfg.step_mode`` values: the registry's decoder-step modes, plus ``auto`` (the torch runtime's own choice).
STEP_MODE_CHOICES: tuple[str, ...] = (*STEP_MODES, "auto")


class BenchCfgError(ValueError):
    """An invalid benchmark configuration; the message names the field."""


@dataclass(frozen=True)
class BenchCfg:
    """What to benchmark and how.

    Attributes:
        bundles: bundle directories.
        runtimes: runtime registry names (``edgecap.runtime.backends.list_runtimes()``); ``torch-rerun`` is the
        re-run-prefix
            baseline; empty = every registered runtime. A registered runtime whose backend is not installed here is
            skipped with the reason.
        precisions: precisions to measure; None = every precision each bundle holds.
        batches: images per query; batch 1 is the single-stream scenario, larger ones the offline scenario.
        beams: beam sizes (1 = greedy, at most ``MAX_BEAM``); None = each bundle's default. Mask-predict bundles
            (LaBERT) decode one hypothesis and are measured at beam 1 only.
        length_levels: 1-based levels to measure length-controllable bundles (LaBERT, ``*-len``) at, or ``"all"``
            (each plan's every level); None = each one's default. Any for a bundle without length control is refused.
        images: a directory of images for the timing pool (bundles that caption images); None = synthetic inputs.
        synthetic: number of distinct synthetic inputs in the pool (when ``images`` is None).
        synthetic_regions: regions per synthetic input for bundles that caption region features.
        max_images: at most this many files of ``images`` (sorted) form the pool.
        quality: measure CIDEr-D on the quality subset when one is available.
        quality_data: dataset directory for quality; None = the bundle's training dataset when it is on this machine.
        quality_features: region-feature directory for ``quality_data`` (region-feature bundles).
        quality_images: size of the fixed quality subset (first N of the test split, else val).
        quality_batch: batch size of the quality run (it does not change the captions).
        warmup, min_repeats, min_seconds, max_repeats: the repeat rule (:class:`~edgecap.bench.harness.LoopCfg`).
        threads: ONNX Runtime's threading (``"auto"``/None, ``"dedicated"``, or an intra-op count, 0 = ONNX Runtime's
            own default; :func:`edgecap.runtime.backends.threads.plan_threads`); a count >= 1 also sets torch's threads.
        spin: force ONNX Runtime's pool threads to spin (True) or not (False); None = the policy's choice.
        device: torch device (``cpu``, ``cuda``, ``cuda:1``); None = CUDA when available.
        providers: ONNX Runtime providers (``cpu``, ``cuda``, ``tensorrt``); None = the best available.
        isolate: run each bundle × runtime × precision in a fresh Python process (memory isolation).
        tegrastats: sample tegrastats (power, unified memory) when it is installed.
        step_mode: the torch runtime's decoder step, one of :data:`STEP_MODE_CHOICES`.
        trt_opt_batch: images per call ONNX Runtime's TensorRT provider tunes its engines for; None = its default
            (``edgecap.runtime.backends.onnxruntime.gpu.DEFAULT_TRT_OPT_BATCH``, the largest of the default
            ``batches``).
        seed: seed of the synthetic inputs and of torch.
    """

    bundles: tuple[str, ...]
    runtimes: tuple[str, ...] = ()
    precisions: tuple[str, ...] | None = None
    batches: tuple[int, ...] = (1, 8)
    beams: tuple[int, ...] | None = None
    length_levels: tuple[int, ...] | str | None = None
    images: str | None = None
    synthetic: int = 32
    synthetic_regions: int = 36
    max_images: int = 64
    quality: bool = True
    quality_data: str | None = None
    quality_features: str | None = None
    quality_images: int = 100
    quality_batch: int = 16
    warmup: int = 3
    min_repeats: int = 10
    min_seconds: float = 2.0
    max_repeats: int = 10_000
    threads: int | str | None = None
    spin: bool | None = None
    device: str | None = None
    providers: tuple[str, ...] | None = None
    isolate: bool = True
    tegrastats: bool = True
    step_mode: str = "eager"
    trt_opt_batch: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        from edgecap.runtime.backends.registry import canonical_runtime, list_runtimes

        for name in ("bundles", "runtimes", "precisions", "batches", "beams", "providers"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                if isinstance(value, (str, Path)):
                    value = (value,)
                object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "bundles", tuple(str(b) for b in self.bundles))
        for name in ("images", "quality_data", "quality_features"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, str(getattr(self, name)))
        if not self.bundles:
            raise BenchCfgError("bundles: give at least one bundle directory")
        # empty = every registered runtime; an older name (an alias) is read as the runtime's current name
        runtimes = self.runtimes or tuple(list_runtimes())
        object.__setattr__(self, "runtimes", tuple(dict.fromkeys(canonical_runtime(r, warn=True) for r in runtimes)))
        unknown = [r for r in self.runtimes if r not in list_runtimes()]
        if unknown:
            raise BenchCfgError(f"runtimes: unknown {unknown}; registered: {list_runtimes()}")
        if self.precisions is not None:
            bad = [p for p in self.precisions if p not in PRECISIONS]
            if bad or not self.precisions:
                raise BenchCfgError(f"precisions: unknown {bad}; known: {list(PRECISIONS)}")
        for name in ("batches", "beams"):
            value = getattr(self, name)
            if value is None:
                continue
            if not value or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in value):
                raise BenchCfgError(f"{name}: need positive integers, got {list(value)}")
            object.__setattr__(self, name, tuple(dict.fromkeys(value)))  # dedupe, keep order
        for name, top, label in (("beams", MAX_BEAM, "MAX_BEAM"), ("batches", harness.MAX_BATCH, "MAX_BATCH")):
            if getattr(self, name) and max(getattr(self, name)) > top:  # a typo would allocate for hours
                raise BenchCfgError(f"{name}: at most {label} ({top}), got {max(getattr(self, name))}")
        if self.batches is None:
            raise BenchCfgError("batches: give at least one batch size")
        self._check_length_levels()
        for name in ("synthetic", "synthetic_regions", "max_images", "quality_batch"):
            if not 1 <= getattr(self, name) <= harness.MAX_SYNTHETIC:  # pool sizes
                raise BenchCfgError(f"{name} must be in 1..{harness.MAX_SYNTHETIC}, got {getattr(self, name)}")
        if self.quality_images < 0:
            raise BenchCfgError(f"quality_images must be >= 0, got {self.quality_images}")
        if self.step_mode not in STEP_MODE_CHOICES:
            raise BenchCfgError(f"step_mode: unknown {self.step_mode!r}; choose one of {list(STEP_MODE_CHOICES)}")
        if self.trt_opt_batch is not None and (isinstance(self.trt_opt_batch, bool) or self.trt_opt_batch < 1):
            raise BenchCfgError(f"trt_opt_batch must be an integer >= 1 or None, got {self.trt_opt_batch!r}")
        try:
            check_threads(self.threads, self.spin)
        except ThreadSettingError as exc:
            raise BenchCfgError(str(exc)) from None
        try:
            self.loop()
        except ValueError as exc:
            raise BenchCfgError(str(exc)) from None

    def _check_length_levels(self) -> None:
        levels = self.length_levels
        if levels is None or levels == ALL_LEVELS:
            return
        if isinstance(levels, str) or not isinstance(levels, (tuple, list)):
            raise BenchCfgError(f"length_levels: give 1-based levels or {ALL_LEVELS!r}, got {levels!r}")
        if not levels or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in levels):
            raise BenchCfgError(f"length_levels: need 1-based levels (integers >= 1), got {list(levels)}")
        object.__setattr__(self, "length_levels", tuple(dict.fromkeys(levels)))

    def levels_for(self, bundle: Any) -> tuple[tuple[int | None, ...], list[str]]:
        """The levels to measure ``bundle`` at, and why any asked-for level is not (beyond its plan).

        ``(None,)`` for a bundle without length control: it is measured once at its own decoding (asking it for
        levels, ``"all"`` too, raises :class:`~edgecap.runtime.length.LengthLevelError`, before anything is measured).
        """
        plan = bundle.length_levels
        default = bundle.default_length_level
        if default is None:
            if self.length_levels is not None:  # refused up front, as `edgecap caption` does
                raise LengthLevelError(f"{bundle.path}: {NO_LENGTH_CONTROL}")
            return (None,), []
        if self.length_levels is None:
            return (default,), []
        if not plan:  # exported before bundles recorded their plan: levels as asked, "all" is unknowable
            if self.length_levels == ALL_LEVELS:
                return (default,), [f"length levels 'all': the bundle records no plan, measured at level {default}"]
            return tuple(cast("tuple[int, ...]", self.length_levels)), []
        if self.length_levels == ALL_LEVELS:
            return tuple(range(1, len(plan) + 1)), []
        levels = cast("tuple[int, ...]", self.length_levels)  # not "all": integers, checked in __post_init__
        kept = tuple(v for v in levels if v <= len(plan))
        dropped = [f"length level {v}: the bundle has levels 1..{len(plan)}" for v in levels if v > len(plan)]
        return kept, dropped

    def loop(self) -> LoopCfg:
        """The repeat rule as a :class:`LoopCfg`."""
        return LoopCfg(self.warmup, self.min_repeats, float(self.min_seconds), self.max_repeats)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}
