"""Jetson's ``tegrastats``: parsing its lines (RAM, swap, GPU and memory-controller load, CPU cores, power rails,
temperatures) and running it in the background for the power and unified-memory figures of a report."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edgecap.runtime._process import terminate

__all__ = ["TOTAL_POWER_RAILS", "TegrastatsMonitor", "TegrastatsSample", "parse_tegrastats_line"]

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
