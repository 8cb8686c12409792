"""Memory and power: peak host RSS, peak GPU memory, Jetson unified memory and power rails.

What is measured, and how (``docs/bench-report-schema.md``, ``memory``/``power``):

- **Peak RSS** is the kernel's high-water mark ``VmHWM`` from ``/proc/self/status`` (``resource.getrusage`` where
  there is no procfs). Before each combination the mark is reset by writing ``5`` to ``/proc/self/clear_refs``
  (Linux ≥ 4.0), so a combination's peak is its own and not the largest one before it; where the reset is refused
  the peak is the process's since it started and the report says so (``rss_peak_scope: "process"``). The driver
  also runs each runtime/precision in a fresh process, so earlier models never inflate a later baseline.
- **GPU memory** through torch's allocator (``max_memory_allocated``/``max_memory_reserved``; torch tensors only) and
  this process's device memory as the driver sees it (ONNX Runtime's CUDA arena and the CUDA context included),
  read in process through NVML (``pynvml``, package ``nvidia-ml-py``, in the ``[gpu]`` extra) and sampled in the
  background; without it the report says why it was not measured.
- **Unified memory** (Jetson: the GPU allocates from system RAM, so RSS misses it): system used memory
  ``total − available`` (``psutil.virtual_memory``), sampled, and tegrastats' ``RAM used/total``.
- **Power** from tegrastats rails (``VDD_IN 4546mW/4546mW``; older boards print ``POM_5V_IN 2116/2116``).

The probes live in :mod:`edgecap.bench.memory_probes` and tegrastats in :mod:`edgecap.bench.tegrastats`; this module
samples them and summarises one combination (:class:`ResourceMonitor`), and re-exports them.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgecap.bench.memory_probes import (
    current_rss_bytes,
    gpu_process_memory,
    nvml_unavailable_reason,
    peak_rss_bytes,
    reset_peak_rss,
    system_used_bytes,
)
from edgecap.bench.tegrastats import TOTAL_POWER_RAILS, TegrastatsMonitor, TegrastatsSample, parse_tegrastats_line

__all__ = [
    "TOTAL_POWER_RAILS",
    "BackgroundSampler",
    "MemoryStats",
    "PowerStats",
    "ResourceMonitor",
    "TegrastatsMonitor",
    "TegrastatsSample",
    "current_rss_bytes",
    "gpu_process_memory",
    "nvml_unavailable_reason",
    "parse_tegrastats_line",
    "peak_rss_bytes",
    "reset_peak_rss",
    "system_used_bytes",
]


# -- periodic sampling -----------------------------------------------------------------------------------------------
class BackgroundSampler:
    """Calls each probe every ``interval_s`` on a daemon thread and keeps ``(time, value)`` per probe.

    Probes return a number or None (nothing to record). Sampling misses spikes shorter than the interval; exact
    high-water marks (``VmHWM``, torch's allocator peaks) are read directly and need no sampler.
    """

    def __init__(
        self,
        probes: dict[str, Callable[[], float | None]],
        interval_s: float = 0.05,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.probes = dict(probes)
        self.interval_s = interval_s
        self.clock = clock
        self.samples: dict[str, list[tuple[float, float]]] = {name: [] for name in self.probes}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def sample_once(self) -> None:
        for name, probe in self.probes.items():
            try:
                value = probe()
            except Exception:  # a probe must never take the benchmark down
                value = None
            if value is not None:
                with self._lock:
                    self.samples[name].append((self.clock(), float(value)))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        if self.probes and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def peak(self, name: str, start: float, end: float) -> float | None:
        with self._lock:
            values = [v for t, v in self.samples.get(name, []) if start <= t <= end]
        return max(values) if values else None


# -- per-combination summaries ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryStats:
    """Memory of one combination (bytes).

    Attributes:
        rss_baseline_bytes: RSS when the combination started (model loaded, inputs prepared).
        rss_peak_bytes: peak RSS during it (``VmHWM``).
        rss_peak_scope: ``"combination"`` (the mark was reset before it) or ``"process"`` (cumulative since start).
        rss_delta_bytes: ``rss_peak − rss_baseline``: what the combination added (batches, activations, caches).
        gpu_allocated_peak_bytes, gpu_reserved_peak_bytes: torch allocator peaks (CUDA only).
        gpu_process_peak_bytes: this process's device memory per NVML, sampled (ONNX Runtime/TensorRT included).
        gpu_process_unmeasured: why ``gpu_process_peak_bytes`` is None on a CUDA device (NVML missing or unusable).
        unified_used_baseline_bytes, unified_used_peak_bytes: system used memory (``psutil``) before and at
            peak, on unified-memory boards (Jetson).
        tegrastats_ram_peak_mb: tegrastats' ``RAM used`` peak.
    """

    rss_baseline_bytes: int | None = None
    rss_peak_bytes: int | None = None
    rss_peak_scope: str = "process"
    rss_delta_bytes: int | None = None
    gpu_allocated_peak_bytes: int | None = None
    gpu_reserved_peak_bytes: int | None = None
    gpu_process_peak_bytes: int | None = None
    gpu_process_unmeasured: str | None = None
    unified_used_baseline_bytes: int | None = None
    unified_used_peak_bytes: int | None = None
    tegrastats_ram_peak_mb: int | None = None


@dataclass(frozen=True)
class PowerStats:
    """Power during one combination's timed calls, from tegrastats.

    Attributes:
        source: ``"tegrastats"``.
        samples: tegrastats lines in the window.
        total_mean_mw, total_peak_mw: module input power (:data:`TOTAL_POWER_RAILS`), None when no such rail.
        rails_mean_mw: mean power per rail.
        gpu_util_mean_pct: mean ``GR3D_FREQ`` load.
        energy_per_image_mj: ``total_mean_mw × timed seconds / images`` (millijoules per image), filled by the driver.
    """

    source: str = "tegrastats"
    samples: int = 0
    total_mean_mw: float | None = None
    total_peak_mw: float | None = None
    rails_mean_mw: dict[str, float] = field(default_factory=dict)
    gpu_util_mean_pct: float | None = None
    energy_per_image_mj: float | None = None

    @classmethod
    def from_samples(cls, samples: Sequence[TegrastatsSample]) -> PowerStats | None:
        """Summary of tegrastats samples; None when there are none or none reports power."""
        if not samples:
            return None
        rails: dict[str, list[float]] = {}
        for sample in samples:
            for name, mw in sample.rails_mw.items():
                rails.setdefault(name, []).append(mw)
        if not rails:
            return None
        totals = [t for t in (s.total_power_mw for s in samples) if t is not None]
        gpu = [s.gpu_util_pct for s in samples if s.gpu_util_pct is not None]
        return cls(
            samples=len(samples),
            total_mean_mw=sum(totals) / len(totals) if totals else None,
            total_peak_mw=max(totals) if totals else None,
            rails_mean_mw={name: sum(v) / len(v) for name, v in sorted(rails.items())},
            gpu_util_mean_pct=sum(gpu) / len(gpu) if gpu else None,
        )


class ResourceMonitor:
    """Everything memory/power for a sequence of combinations in one process.

    Usage::

        with ResourceMonitor(cuda_device=None, unified=False) as monitor:
            for combination in ...:
                window = monitor.begin()
                ...  # timed calls
                memory, power = monitor.end(window)

    Args:
        cuda_device: the CUDA device in use (NVML sampling, and torch's allocator peaks when torch is in use), or None
            on CPU.
        unified: sample the system's used memory (unified-memory boards).
        tegrastats: run tegrastats when it is installed.
        interval_s: sampling period of every probe (each reading is an in-process call of microseconds).
    """

    def __init__(
        self,
        cuda_device: Any = None,
        unified: bool = False,
        tegrastats: bool = True,
        interval_s: float = 0.05,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.cuda_device = cuda_device
        self.unified = unified
        self.clock = clock
        self.samplers: list[BackgroundSampler] = []
        if unified:
            self.samplers.append(BackgroundSampler({"unified_used": system_used_bytes}, interval_s, clock))
        self.gpu_unmeasured = nvml_unavailable_reason() if cuda_device is not None else None
        if cuda_device is not None and self.gpu_unmeasured is None:
            self.samplers.append(BackgroundSampler({"gpu_process": gpu_process_memory}, interval_s, clock))
        self.tegrastats = TegrastatsMonitor(clock=clock) if tegrastats and TegrastatsMonitor.available() else None
        self._can_reset_rss = False

    def __enter__(self) -> ResourceMonitor:
        for sampler in self.samplers:
            sampler.start()
        if self.tegrastats is not None and not self.tegrastats.start():
            self.tegrastats = None
        return self

    def __exit__(self, *exc: object) -> None:
        for sampler in self.samplers:
            sampler.stop()
        if self.tegrastats is not None:
            self.tegrastats.stop()

    def _torch_cuda(self) -> Any:
        """torch, when a CUDA device is measured and torch is in use in this process (its allocator peaks mean
        something only then); None otherwise, so an ONNX Runtime-only process never imports torch for them."""
        torch = sys.modules.get("torch")
        if self.cuda_device is None or torch is None or not torch.cuda.is_available():
            return None
        return torch

    def begin(self) -> dict[str, Any]:
        """Reset the high-water marks and remember where the combination starts."""
        self._can_reset_rss = reset_peak_rss()
        torch = self._torch_cuda()
        if torch is not None:
            torch.cuda.synchronize(self.cuda_device)
            torch.cuda.reset_peak_memory_stats(self.cuda_device)
        for sampler in self.samplers:
            sampler.sample_once()  # a sample at the start of every window, however short the window
        return {
            "t0": self.clock(),
            "rss": current_rss_bytes(),
            "unified": system_used_bytes() if self.unified else None,
        }

    def _peak(self, name: str, start: float, end: float) -> float | None:
        peaks = [p for p in (s.peak(name, start, end) for s in self.samplers if name in s.probes) if p is not None]
        return max(peaks) if peaks else None

    def end(self, window: dict[str, Any], power_from: float | None = None) -> tuple[MemoryStats, PowerStats | None]:
        """Peaks since :meth:`begin`, and the power from ``power_from`` (a ``clock()`` reading, e.g. the end of the
        warm-up, so power averages the timed calls only; default the whole window) to now."""
        for sampler in self.samplers:
            sampler.sample_once()
        t1 = self.clock()
        gpu_alloc = gpu_reserved = None
        torch = self._torch_cuda()
        if torch is not None:
            torch.cuda.synchronize(self.cuda_device)
            gpu_alloc = int(torch.cuda.max_memory_allocated(self.cuda_device))
            gpu_reserved = int(torch.cuda.max_memory_reserved(self.cuda_device))
        tegra = self.tegrastats.window(window["t0"], t1) if self.tegrastats is not None else []
        start = window["t0"] if power_from is None else power_from
        timed = self.tegrastats.window(start, t1) if self.tegrastats is not None else []
        ram_peaks = [s.ram_used_mb for s in tegra if s.ram_used_mb is not None]
        gpu_process = self._peak("gpu_process", window["t0"], t1)
        unified_peak = self._peak("unified_used", window["t0"], t1)
        baseline, peak = window["rss"], peak_rss_bytes()
        memory = MemoryStats(
            rss_baseline_bytes=baseline,
            rss_peak_bytes=peak,
            rss_peak_scope="combination" if self._can_reset_rss else "process",
            rss_delta_bytes=max(0, peak - baseline) if peak is not None and baseline is not None else None,
            gpu_allocated_peak_bytes=gpu_alloc,
            gpu_reserved_peak_bytes=gpu_reserved,
            gpu_process_peak_bytes=None if gpu_process is None else int(gpu_process),
            gpu_process_unmeasured=self.gpu_unmeasured,
            unified_used_baseline_bytes=window["unified"],
            unified_used_peak_bytes=None if unified_peak is None else int(unified_peak),
            tegrastats_ram_peak_mb=max(ram_peaks) if ram_peaks else None,
        )
        return memory, PowerStats.from_samples(timed)
