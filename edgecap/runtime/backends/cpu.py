"""What this CPU is: its name, its feature flags, its physical cores, and the INT8 preset it runs correctly.

The one reader of ``/proc/cpuinfo`` (``tests/test_single_sources.py`` keeps it so): the bench environment, the
INT8 presets, the ONNX Runtime loader's choice of INT8 variant and the thread policy all ask here. ``psutil`` gives
the core counts; it reports neither the CPU's name nor its flags, so those come from ``/proc/cpuinfo``. Torch-free.

ONNX Runtime's x86 int8 kernels saturate without VNNI unless weights use 7 bits (``reduce_range``), and 64-bit ARM
has its own scheme; the presets themselves live in :mod:`edgecap.workshop.export.calibration.presets`.
"""

from __future__ import annotations

import platform
from pathlib import Path

__all__ = [
    "ARM_MACHINES",
    "VNNI_FLAGS",
    "cpu_flags",
    "cpu_model",
    "detect_cpu_preset",
    "parse_cpuinfo",
    "physical_cores",
    "read_cpuinfo",
]

#: ``/proc/cpuinfo`` flags of int8 dot-product instructions that accumulate without int16 saturation.
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "avx512vnni", "amx_int8")
ARM_MACHINES = ("aarch64", "arm64", "armv8l")

_CPUINFO = Path("/proc/cpuinfo")
#: The keys of the feature flags: ``flags`` on x86, ``Features`` on ARM.
_FLAG_KEYS = ("flags", "features")
#: The keys that name the CPU, in order: x86 ``model name``, ARM ``Model``/``Hardware``, MIPS/others ``cpu model``.
_MODEL_KEYS = ("model name", "Model", "Hardware", "cpu model")


def read_cpuinfo() -> str:
    """This machine's ``/proc/cpuinfo``; empty where it does not exist or cannot be read (macOS, Windows, containers
    hiding ``/proc``)."""
    try:
        return _CPUINFO.read_text(errors="replace") if _CPUINFO.is_file() else ""
    except OSError:
        return ""


def parse_cpuinfo(text: str) -> list[dict[str, str]]:
    """``/proc/cpuinfo`` as one dict per processor block (keys as printed, e.g. ``model name``, ``core id``)."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        if ":" in line:
            key, value = line.split(":", 1)
            current[key.strip()] = value.strip()
    if current:
        blocks.append(current)
    return blocks


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """Every feature flag any processor lists (x86 ``flags``, ARM ``Features``), from ``cpuinfo`` (the text of
    ``/proc/cpuinfo``; default this machine's). Empty where there is nothing to read."""
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    return frozenset(
        flag
        for block in parse_cpuinfo(text)
        for key, value in block.items()
        if key.lower() in _FLAG_KEYS
        for flag in value.split()
    )


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's marketing name (x86 ``model name``; ARM ``Model``/``Hardware`` or the implementer/part codes), from
    ``cpuinfo`` (default this machine's ``/proc/cpuinfo``); else what :mod:`platform` says."""
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    blocks = parse_cpuinfo(text)
    for key in _MODEL_KEYS:
        for block in blocks:
            if block.get(key):
                return block[key]
    for block in blocks:
        if "CPU implementer" in block and "CPU part" in block:
            return f"ARM implementer {block['CPU implementer']} part {block['CPU part']}"
    return platform.processor() or platform.machine()


def physical_cores() -> int | None:
    """Physical CPU cores (``psutil``); None when the platform does not say, or on a minimal edge install without
    ``psutil`` (callers then fall back on the affinity or ``os.cpu_count()``)."""
    try:
        import psutil
    except ImportError:
        return None
    return psutil.cpu_count(logical=False)


def detect_cpu_preset(cpuinfo: str | None = None, machine: str | None = None) -> str:
    """The CPU preset for a machine: ``arm64`` on 64-bit ARM, ``cpu-vnni`` on x86 with a VNNI flag, else ``cpu-avx2``.

    Args:
        cpuinfo: the text of ``/proc/cpuinfo``; default read from this machine (empty where it does not exist).
        machine: ``platform.machine()``; default this machine's.

    Without flags to read (macOS, Windows, containers hiding ``/proc``) an x86 machine gets ``cpu-avx2``: its
    ``reduce_range`` costs one bit of weight resolution but never saturates, on any x86 CPU.
    """
    machine = (machine if machine is not None else platform.machine()).lower()
    if machine in ARM_MACHINES:
        return "arm64"
    flags = cpu_flags(cpuinfo)
    if "asimddp" in flags:  # an ARM kernel reporting dot-product support under an unusual machine name
        return "arm64"
    return "cpu-vnni" if flags & set(VNNI_FLAGS) else "cpu-avx2"
