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
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgecap.runtime._process import terminate

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


# -- host RSS --------------------------------------------------------------------------------------------------------
def _status_kib(field_name: str, text: str | None = None) -> int | None:
    if text is None:
        try:
            text = Path("/proc/self/status").read_text()
        except OSError:
            return None
    match = re.search(rf"^{field_name}:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def peak_rss_bytes(status_text: str | None = None) -> int | None:
    """This process's peak resident set size in bytes (``VmHWM``; ``ru_maxrss`` without procfs)."""
    kib = _status_kib("VmHWM", status_text)
    if kib is not None:
        return kib * 1024
    if status_text is not None:
        return None
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # macOS reports bytes, Linux KiB


def current_rss_bytes() -> int | None:
    """This process's resident set size now, in bytes (``psutil``)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def reset_peak_rss() -> bool:
    """Reset the ``VmHWM`` high-water mark to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


# -- system memory (unified memory) ---------------------------------------------------------------------------------
def system_used_bytes() -> int | None:
    """System memory in use, ``total − available`` (what a unified-memory board has left to give)."""
    import psutil

    memory = psutil.virtual_memory()
    return int(memory.total - memory.available)


# -- NVML (device memory of this process) ----------------------------------------------------------------------------
_nvml_state: dict[str, Any] = {}


def _nvml() -> Any:
    """``pynvml``, initialised once per process; raises ImportError/``NVMLError`` when NVML cannot be used."""
    if "module" not in _nvml_state:
        import pynvml

        pynvml.nvmlInit()
        _nvml_state["module"] = pynvml
    return _nvml_state["module"]


def nvml_unavailable_reason() -> str | None:
    """None when NVML answers here, else why this process's device memory cannot be measured."""
    try:
        _nvml()
    except ImportError:
        return "pynvml is not installed (pip install nvidia-ml-py, or edgecap[gpu])"
    except Exception as exc:  # pynvml.NVMLError and its many subclasses: no driver, no device, no permission
        return f"NVML is not usable here: {exc}"
    return None


def gpu_process_memory(pid: int | None = None) -> int | None:
    """Device memory of process ``pid`` (default: this one) summed over the GPUs, per NVML; None when NVML is not
    usable or does not list the process (e.g. a container whose PIDs the driver does not see)."""
    try:
        nvml = _nvml()
    except Exception:
        return None
    pid = os.getpid() if pid is None else pid
    used = None
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == pid and isinstance(process.usedGpuMemory, int):  # None/N/A under some drivers
                used = (used or 0) + int(process.usedGpuMemory)
    return used


# -- tegrastats ------------------------------------------------------------------------------------------------------
#: Rails that measure the whole module's input power, in order of preference (Nano/NX/TX2/Orin Nano: ``VDD_IN``;
#: Nano on L4T 32: ``POM_5V_IN``; AGX Orin: ``VIN_SYS_5V0``). Other rails are parts of it and are reported per rail.
TOTAL_POWER_RAILS = ("VDD_IN", "POM_5V_IN", "VIN_SYS_5V0", "VIN")

_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_SWAP = re.compile(r"\bSWAP (\d+)/(\d+)MB")
_GR3D = re.compile(r"\bGR3D_FREQ (\d+)%")
_EMC = re.compile(r"\bEMC_FREQ (\d+)%")
_CPU = re.compile(r"\bCPU \[([^\]]*)\]")
_RAIL = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?(?=\s|$)")
_TEMP = re.compile(r"\b([A-Za-z][\w]*)@(-?\d+(?:\.\d+)?)C\b")


@dataclass(frozen=True)
class TegrastatsSample:
    """One tegrastats line.

    Attributes:
        ram_used_mb, ram_total_mb: ``RAM used/totalMB`` (CPU and GPU share it on Jetson).
        swap_used_mb: ``SWAP used/totalMB``.
        gpu_util_pct: ``GR3D_FREQ`` load.
        emc_util_pct: memory controller load (``EMC_FREQ``).
        cpu_util_pct: per-core load, None for cores that are ``off``.
        rails_mw: rail name -> instantaneous power in mW (the first number; the second is tegrastats' running mean).
        temps_c: sensor -> °C.
    """

    ram_used_mb: int | None = None
    ram_total_mb: int | None = None
    swap_used_mb: int | None = None
    gpu_util_pct: float | None = None
    emc_util_pct: float | None = None
    cpu_util_pct: tuple[float | None, ...] = ()
    rails_mw: dict[str, float] = field(default_factory=dict)
    temps_c: dict[str, float] = field(default_factory=dict)

    @property
    def total_power_mw(self) -> float | None:
        """The module's input power (the first of :data:`TOTAL_POWER_RAILS` present), else None."""
        for rail in TOTAL_POWER_RAILS:
            if rail in self.rails_mw:
                return self.rails_mw[rail]
        return None


def parse_tegrastats_line(line: str) -> TegrastatsSample | None:
    """Parse one line of ``tegrastats`` output (L4T 32 to JetPack 6 formats); None for a line with no ``RAM`` field
    (not a tegrastats sample)."""
    ram = _RAM.search(line)
    if ram is None:
        return None
    swap = _SWAP.search(line)
    gpu = _GR3D.search(line)
    emc = _EMC.search(line)
    cpus: tuple[float | None, ...] = ()
    cpu = _CPU.search(line)
    if cpu is not None:
        loads = []
        for core in cpu.group(1).split(","):
            match = re.match(r"\s*(\d+)%", core)
            loads.append(float(match.group(1)) if match else None)
        cpus = tuple(loads)
    rails = {m.group(1): float(m.group(2)) for m in _RAIL.finditer(line) if m.group(1) not in ("RAM", "SWAP")}
    temps = {m.group(1): float(m.group(2)) for m in _TEMP.finditer(line)}
    return TegrastatsSample(
        ram_used_mb=int(ram.group(1)),
        ram_total_mb=int(ram.group(2)),
        swap_used_mb=int(swap.group(1)) if swap else None,
        gpu_util_pct=float(gpu.group(1)) if gpu else None,
        emc_util_pct=float(emc.group(1)) if emc else None,
        cpu_util_pct=cpus,
        rails_mw=rails,
        temps_c=temps,
    )


class TegrastatsMonitor:
    """Runs ``tegrastats --interval MS`` in the background and keeps every parsed sample with its arrival time.

    Only the process this object started is stopped (by its handle). :meth:`window` returns the samples between two
    ``clock()`` readings, so one monitor serves every combination of a run.
    """

    def __init__(self, interval_ms: int = 100, clock: Callable[[], float] = time.perf_counter) -> None:
        self.interval_ms = int(interval_ms)
        self.clock = clock
        self.samples: list[tuple[float, TegrastatsSample]] = []
        self._process: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @staticmethod
    def available() -> bool:
        return shutil.which("tegrastats") is not None

    def start(self) -> bool:
        """Start tegrastats; False when it is not installed or cannot run."""
        exe = shutil.which("tegrastats")
        if exe is None:
            return False
        try:
            self._process = subprocess.Popen(
                [exe, "--interval", str(self.interval_ms)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1,
            )
        except OSError:
            return False
        self._thread = threading.Thread(target=self._read, name="tegrastats-reader", daemon=True)
        self._thread.start()
        return True

    def feed(self, line: str) -> None:
        """Record one output line (used by the reader thread, and by tests with sample strings)."""
        sample = parse_tegrastats_line(line)
        if sample is not None:
            with self._lock:
                self.samples.append((self.clock(), sample))

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            self.feed(line)

    def window(self, start: float, end: float) -> list[TegrastatsSample]:
        with self._lock:
            return [s for t, s in self.samples if start <= t <= end]

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            terminate(process, timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


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
