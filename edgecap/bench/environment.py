"""The environment block of a report: what the numbers depend on.

CPU model, physical and logical cores, the CPUs this process may use, thread settings, memory, software versions
(edgecap, Python, torch + CUDA, onnxruntime + its execution providers, onnx, numpy), GPUs and driver, Jetson
model / L4T release / ``nvpmodel`` power mode, CPU frequency governor and the load average. Cores and memory come
from ``psutil``, the GPU driver from NVML (``pynvml``) when installed, the CPU's name and cores from
:mod:`edgecap.runtime.backends.cpu` (the name from ``/proc/cpuinfo``: no library reports it portably), the rest from
sysfs, package metadata and ``nvpmodel``; a field that cannot be read is None. Parsers take text so tests feed them
sample strings.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from edgecap._version import __version__
from edgecap.runtime.backends.cpu import cpu_model, parse_cpuinfo, physical_cores
from edgecap.runtime.bundle.manifest import DISTRIBUTIONS, installed_version

__all__ = [
    "capture_environment",
    "cpu_model",
    "jetson_model",
    "parse_cpuinfo",
    "parse_nvpmodel",
    "physical_cores",
]

#: A bundle's software (``edgecap.runtime.bundle.manifest.DISTRIBUTIONS``) plus TensorRT, which a bench run may use.
_DISTRIBUTIONS = {**DISTRIBUTIONS, "tensorrt": ("tensorrt",)}


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def _run(args: list[str], timeout_s: float = 5.0) -> str | None:
    exe = shutil.which(args[0])
    if exe is None:
        return None
    try:
        return subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def jetson_model() -> str | None:
    """The board name on NVIDIA Jetson (device-tree model, or the L4T release file), else None."""
    model = _read("/proc/device-tree/model")
    if model and ("jetson" in model.lower() or "nvidia" in model.lower()):
        return model.strip("\x00 \n")
    if Path("/etc/nv_tegra_release").is_file():
        return "NVIDIA Jetson (model unknown)"
    return None


def parse_nvpmodel(text: str) -> str | None:
    """The power mode from ``nvpmodel -q`` output (``NV Power Mode: MAXN`` then the mode id)."""
    match = re.search(r"NV Power Mode:\s*(.+)", text)
    if match is None:
        return None
    mode = match.group(1).strip()
    rest = text[match.end() :].split()
    return f"{mode} (id {rest[0]})" if rest and rest[0].isdigit() else mode


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"edgecap": __version__, "python": platform.python_version()}
    out.update({key: installed_version(names) for key, names in _DISTRIBUTIONS.items()})
    return out


def module_installed(name: str) -> bool:
    """Whether ``name`` can be imported here, without importing it (a broken or blocked install counts as absent)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _torch_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {}
    info: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": [],
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            info["gpus"].append(
                {
                    "index": i,
                    "name": props.name,
                    "memory_bytes": int(props.total_memory),
                    "capability": list(torch.cuda.get_device_capability(i)),
                }
            )
        info["cudnn"] = torch.backends.cudnn.version()
    return info


def _onnxruntime_providers() -> list[str] | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    return list(onnxruntime.get_available_providers())


def _nvml_gpus() -> dict[str, Any] | None:
    """The driver version and each GPU's name, memory and power limit per NVML; None without NVML or a GPU."""
    from edgecap.bench.memory import nvml_unavailable_reason

    if nvml_unavailable_reason() is not None:
        return None
    import pynvml

    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        try:
            limit: str | None = f"{pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000:.2f} W"
        except pynvml.NVMLError:  # not supported on some boards
            limit = None
        name = pynvml.nvmlDeviceGetName(handle)
        gpus.append(
            {
                "name": name.decode() if isinstance(name, bytes) else name,
                "memory": f"{pynvml.nvmlDeviceGetMemoryInfo(handle).total >> 20} MiB",
                "power_limit": limit,
            }
        )
    driver = pynvml.nvmlSystemGetDriverVersion()
    return {"driver": driver.decode() if isinstance(driver, bytes) else driver, "gpus": gpus}


def capture_environment() -> dict[str, Any]:
    """The environment block (see ``docs/bench-report-schema.md``, ``environment``)."""
    import psutil

    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    jetson = jetson_model()
    nvpmodel = _run(["nvpmodel", "-q"]) if jetson else None
    l4t = _read("/etc/nv_tegra_release")
    governor = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    env: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "physical_cores": physical_cores(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(affinity) if affinity is not None else os.cpu_count(),
        "memory_bytes": int(psutil.virtual_memory().total),
        "versions": _versions(),
        "onnxruntime_providers": _onnxruntime_providers(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cpu_governor": governor.strip() if governor else None,
        "jetson": jetson,
        "l4t_release": l4t.splitlines()[0].lstrip("# ").strip() if l4t else None,
        "power_mode": parse_nvpmodel(nvpmodel) if nvpmodel else None,
        "nvidia_smi": _nvml_gpus(),  # the key predates NVML; the fields are what nvidia-smi printed
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    env.update(_torch_info())
    return env
