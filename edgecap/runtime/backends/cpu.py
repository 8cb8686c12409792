"""Which INT8 preset this CPU runs correctly (torch-free: the ONNX Runtime loader picks INT8 variants with it).

ONNX Runtime's x86 int8 kernels saturate without VNNI unless weights use 7 bits (``reduce_range``), and 64-bit ARM
has its own scheme; the presets themselves live in :mod:`edgecap.build.export.calibration.presets`.
"""

from __future__ import annotations

import platform
from pathlib import Path

__all__ = ["ARM_MACHINES", "VNNI_FLAGS", "detect_cpu_preset"]

VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "avx512vnni", "amx_int8")
ARM_MACHINES = ("aarch64", "arm64", "armv8l")


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
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        try:
            cpuinfo = path.read_text(errors="replace") if path.is_file() else ""
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    if "asimddp" in flags:  # an ARM kernel reporting dot-product support under an unusual machine name
        return "arm64"
    return "cpu-vnni" if flags & set(VNNI_FLAGS) else "cpu-avx2"
