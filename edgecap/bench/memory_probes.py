"""Memory probes, each one in-process reading: this process's RSS and its ``VmHWM`` high-water mark, the system's
used memory (unified-memory boards) and this process's device memory through NVML. :mod:`edgecap.bench.memory`
explains what each number means in a report and re-exports them."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "current_rss_bytes",
    "gpu_process_memory",
    "nvml_unavailable_reason",
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
