"""The one source of CPU facts: name, flags and cores, read from sample ``/proc/cpuinfo`` texts, and its users."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgecap.runtime.backends import cpu
from edgecap.runtime.backends.cpu import cpu_flags, cpu_model, detect_cpu_preset, physical_cores, read_cpuinfo

X86_VNNI = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni amx_int8
"""
ARM = "processor\t: 0\nFeatures\t: fp asimd asimddp\nCPU implementer\t: 0x41\nCPU part\t: 0xd08\nHardware\t: BCM2835\n"


def test_flags_are_every_processors_flags_x86_and_arm() -> None:
    assert cpu_flags(X86_VNNI) == {"fpu", "sse2", "avx2", "avx512f", "avx512_vnni", "amx_int8"}
    assert cpu_flags(ARM) == {"fp", "asimd", "asimddp"}
    assert cpu_flags("") == frozenset()


def test_model_name_x86_arm_and_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cpu_model(X86_VNNI) == "Intel(R) Xeon(R) Platinum 8480+"
    assert cpu_model(ARM) == "BCM2835"
    assert cpu_model(ARM.replace("Hardware\t: BCM2835\n", "")) == "ARM implementer 0x41 part 0xd08"
    monkeypatch.setattr(cpu.platform, "processor", lambda: "")
    monkeypatch.setattr(cpu.platform, "machine", lambda: "x86_64")
    assert cpu_model("") == "x86_64"


def test_the_preset_reads_the_same_flags() -> None:
    assert detect_cpu_preset(X86_VNNI, "x86_64") == "cpu-vnni"
    assert detect_cpu_preset(X86_VNNI.replace("avx512_vnni", "").replace("amx_int8", ""), "x86_64") == "cpu-avx2"
    assert detect_cpu_preset(ARM, "weird-arm") == "arm64"


def test_a_machine_without_cpuinfo_reads_empty(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cpu, "_CPUINFO", tmp_path / "absent")
    assert read_cpuinfo() == "" and cpu_flags() == frozenset() and detect_cpu_preset(machine="x86_64") == "cpu-avx2"
    (tmp_path / "cpuinfo").write_text(X86_VNNI)
    monkeypatch.setattr(cpu, "_CPUINFO", tmp_path / "cpuinfo")
    assert cpu_model() == "Intel(R) Xeon(R) Platinum 8480+" and detect_cpu_preset(machine="x86_64") == "cpu-vnni"


def test_physical_cores_without_psutil_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    assert physical_cores() == psutil.cpu_count(logical=False)
    monkeypatch.setitem(sys.modules, "psutil", None)  # a minimal edge install
    assert physical_cores() is None


def test_the_bench_and_the_thread_policy_ask_here(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgecap.bench import environment
    from edgecap.runtime.backends import threads
    from tools import random_models

    assert environment.cpu_model is cpu_model and environment.physical_cores is physical_cores
    assert random_models.cpu_model is cpu_model
    assert threads.physical_cores is physical_cores
    monkeypatch.setattr(threads, "physical_cores", lambda: 3)
    assert threads.usable_cores(affinity=lambda _pid: set(range(8)), logical=lambda: 8) == 3
