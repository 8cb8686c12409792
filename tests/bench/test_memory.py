"""Memory and power probes: tegrastats lines of several Jetson generations, psutil, NVML, RSS reset."""

from __future__ import annotations

import os

import pytest

from edgecap.bench.memory import (
    BackgroundSampler,
    PowerStats,
    ResourceMonitor,
    TegrastatsMonitor,
    current_rss_bytes,
    gpu_process_memory,
    nvml_unavailable_reason,
    parse_tegrastats_line,
    peak_rss_bytes,
    reset_peak_rss,
    system_used_bytes,
)

NANO_L4T32 = (
    "RAM 2155/3964MB (lfb 1/4MB) SWAP 0/1982MB (cached 0MB) IRAM 0/252kB(lfb 252kB) "
    "CPU [10%@1479,2%@1479,4%@1479,3%@1479] EMC_FREQ 0%@1600 GR3D_FREQ 13%@921 APE 25 PLL@34C CPU@36.5C "
    "PMIC@100C GPU@35C AO@43C thermal@35.75C POM_5V_IN 2116/2116 POM_5V_GPU 0/0 POM_5V_CPU 357/357"
)
XAVIER_NX = (
    "RAM 2503/7765MB (lfb 1047x4MB) SWAP 0/3882MB (cached 0MB) CPU [3%@1190,2%@1190,1%@1190,1%@1190,off,off] "
    "EMC_FREQ 0% GR3D_FREQ 0% AUX@33C CPU@34.5C thermal@33.85C AO@34.5C GPU@33.5C PMIC@100C "
    "VDD_IN 3953/3953 VDD_CPU_GPU_CV 397/397 VDD_SOC 1231/1231"
)
AGX_ORIN_JP5 = (
    "11-22-2026 17:33:03 RAM 2915/30536MB (lfb 6587x4MB) SWAP 0/15268MB (cached 0MB) "
    "CPU [1%@729,0%@729,0%@729,0%@729,0%@729,0%@729,0%@729,0%@729] EMC_FREQ 0%@2133 GR3D_FREQ 57%@[0,0] "
    "VIC_FREQ 729 APE 174 CV0@-256C CPU@45.312C Tboard@33C SOC2@41.593C Tdiode@35.5C SOC0@42.25C "
    "VDD_GPU_SOC 3200mW/3100mW VDD_CPU_CV 800mW/800mW VIN_SYS_5V0 3828mW/3828mW VDDQ_VDD2_1V8AO 503mW/503mW"
)
ORIN_NANO_JP6 = (
    "RAM 2141/7620MB (lfb 2x4MB) SWAP 0/3810MB (cached 0MB) CPU [2%@729,1%@729,0%@729,0%@729,off,off] "
    "GR3D_FREQ 0% cpu@47.5C soc2@46.1C soc0@46.8C gpu@46.2C tj@47.5C soc1@45.9C "
    "VDD_IN 4546mW/4546mW VDD_CPU_GPU_CV 515mW/515mW VDD_SOC 1376mW/1376mW"
)

# JetPack 6 (L4T 36) on AGX Orin: timestamp, per-cluster GR3D frequencies, engines reported "off", rails in mW.
AGX_ORIN_JP6 = (
    "11-26-2026 04:00:01 RAM 6124/62841MB (lfb 13283x4MB) SWAP 0/31421MB (cached 0MB) "
    "CPU [12%@2201,4%@2201,0%@2201,1%@2201,off,off,off,off,3%@2201,0%@2201,0%@2201,0%@2201] "
    "EMC_FREQ 7%@3199 GR3D_FREQ 91%@[1300,1300] NVENC off NVDEC off NVJPG off NVJPG1 off VIC off OFA off "
    "NVDLA0 off NVDLA1 off PVA0_FREQ off APE 174 cpu@48.5C soc2@44.25C soc0@45.5C gpu@51.75C tj@51.75C "
    "soc1@44.1C VDD_GPU_SOC 11988mW/9430mW VDD_CPU_CV 1593mW/1401mW VIN_SYS_5V0 6172mW/5980mW"
)


def test_tegrastats_agx_orin_jp6_engines_off_and_unified_memory() -> None:
    s = parse_tegrastats_line(AGX_ORIN_JP6)
    assert s is not None
    assert (s.ram_used_mb, s.ram_total_mb, s.swap_used_mb) == (6124, 62841, 0)  # CPU + GPU share this RAM
    assert s.gpu_util_pct == 91.0 and s.emc_util_pct == 7.0
    assert len(s.cpu_util_pct) == 12 and s.cpu_util_pct[4] is None
    assert s.rails_mw == {"VDD_GPU_SOC": 11988.0, "VDD_CPU_CV": 1593.0, "VIN_SYS_5V0": 6172.0}
    assert s.total_power_mw == 6172.0
    assert s.temps_c["gpu"] == 51.75 and "APE" not in s.rails_mw


def test_tegrastats_nano_l4t32() -> None:
    s = parse_tegrastats_line(NANO_L4T32)
    assert s is not None
    assert (s.ram_used_mb, s.ram_total_mb, s.swap_used_mb) == (2155, 3964, 0)
    assert s.gpu_util_pct == 13.0 and s.emc_util_pct == 0.0
    assert s.cpu_util_pct == (10.0, 2.0, 4.0, 3.0)
    assert s.rails_mw == {"POM_5V_IN": 2116.0, "POM_5V_GPU": 0.0, "POM_5V_CPU": 357.0}
    assert s.total_power_mw == 2116.0
    assert s.temps_c["GPU"] == 35.0 and s.temps_c["thermal"] == 35.75


def test_tegrastats_xavier_nx_off_cores_and_vdd_in() -> None:
    s = parse_tegrastats_line(XAVIER_NX)
    assert s is not None
    assert s.cpu_util_pct == (3.0, 2.0, 1.0, 1.0, None, None)
    assert s.rails_mw == {"VDD_IN": 3953.0, "VDD_CPU_GPU_CV": 397.0, "VDD_SOC": 1231.0}
    assert s.total_power_mw == 3953.0


def test_tegrastats_agx_orin_mw_units_and_timestamp() -> None:
    s = parse_tegrastats_line(AGX_ORIN_JP5)
    assert s is not None
    assert (s.ram_used_mb, s.ram_total_mb) == (2915, 30536)
    assert s.gpu_util_pct == 57.0
    assert s.rails_mw["VDD_GPU_SOC"] == 3200.0  # the instantaneous value, not the running mean
    assert s.total_power_mw == 3828.0  # AGX Orin's input rail
    assert "VIC_FREQ" not in s.rails_mw and "RAM" not in s.rails_mw
    assert s.temps_c["CV0"] == -256.0 and s.temps_c["CPU"] == pytest.approx(45.312)


def test_tegrastats_orin_nano_jp6() -> None:
    s = parse_tegrastats_line(ORIN_NANO_JP6)
    assert s is not None
    assert s.total_power_mw == 4546.0 and s.emc_util_pct is None
    assert set(s.rails_mw) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}


def test_tegrastats_without_power_rails() -> None:
    s = parse_tegrastats_line("RAM 1000/4000MB (lfb 1x4MB) CPU [5%@100] GR3D_FREQ 1%")
    assert s is not None and s.rails_mw == {} and s.total_power_mw is None
    assert PowerStats.from_samples([s]) is None


@pytest.mark.parametrize("line", ["", "hello", "Usage: tegrastats [-option]", "SWAP 0/1982MB"])
def test_tegrastats_rejects_other_lines(line: str) -> None:
    assert parse_tegrastats_line(line) is None


def test_power_stats_from_samples() -> None:
    samples = [
        parse_tegrastats_line(line) for line in (XAVIER_NX, XAVIER_NX.replace("VDD_IN 3953/3953", "VDD_IN 6047/5000"))
    ]
    power = PowerStats.from_samples([s for s in samples if s is not None])
    assert power is not None and power.samples == 2
    assert power.total_mean_mw == pytest.approx(5000.0) and power.total_peak_mw == 6047.0
    assert power.rails_mean_mw["VDD_SOC"] == 1231.0
    assert power.gpu_util_mean_pct == 0.0


def test_tegrastats_monitor_windows_by_arrival_time() -> None:
    now = [0.0]
    monitor = TegrastatsMonitor(clock=lambda: now[0])
    for t, line in ((1.0, NANO_L4T32), (2.0, "not a sample"), (3.0, XAVIER_NX), (5.0, ORIN_NANO_JP6)):
        now[0] = t
        monitor.feed(line)
    assert len(monitor.samples) == 3
    window = monitor.window(2.5, 5.0)
    assert [s.total_power_mw for s in window] == [3953.0, 4546.0]


# -- procfs, psutil, NVML --------------------------------------------------------------------------------------------
def test_system_used_memory_is_total_minus_available() -> None:
    import psutil

    used = system_used_bytes()
    total = psutil.virtual_memory().total
    assert used is not None and 0 < used < total


STATUS = "Name:\tpython\nVmPeak:\t  900 kB\nVmHWM:\t  600000 kB\nVmRSS:\t  500000 kB\n"


def test_peak_rss_from_status_text() -> None:
    assert peak_rss_bytes(STATUS) == 600000 * 1024
    assert peak_rss_bytes("Name:\tpython\n") is None


def test_peak_rss_reset_lowers_the_mark() -> None:
    before = peak_rss_bytes()
    assert before is not None and before >= (current_rss_bytes() or 0)
    block = bytearray(64 << 20)
    block[::4096] = b"\x01" * len(block[::4096])  # touch every page
    high = peak_rss_bytes()
    del block
    if not reset_peak_rss():
        pytest.skip("this kernel refuses /proc/self/clear_refs")
    after = peak_rss_bytes()
    assert high is not None and after is not None and after < high


def test_without_nvml_gpu_memory_is_not_measured_and_says_why(monkeypatch) -> None:
    import builtins

    from edgecap.bench import memory_probes

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(memory_probes, "_nvml_state", {})
    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    assert "nvidia-ml-py" in nvml_unavailable_reason()
    assert gpu_process_memory() is None
    monitor = ResourceMonitor(cuda_device="cuda:0", tegrastats=False)
    assert monitor.samplers == []
    window = monitor.begin()
    stats, _ = monitor.end(window)
    assert stats.gpu_process_peak_bytes is None and "nvidia-ml-py" in stats.gpu_process_unmeasured


def test_nvml_reports_this_process_summed_over_devices(monkeypatch) -> None:
    from types import SimpleNamespace

    from edgecap.bench import memory_probes

    me = os.getpid()
    devices = [
        [SimpleNamespace(pid=me, usedGpuMemory=300 << 20), SimpleNamespace(pid=1, usedGpuMemory=9 << 30)],
        [SimpleNamespace(pid=me, usedGpuMemory=None)],  # N/A under some drivers
        [SimpleNamespace(pid=me, usedGpuMemory=100 << 20)],
    ]
    fake = SimpleNamespace(
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetComputeRunningProcesses=lambda handle: devices[handle],
    )
    monkeypatch.setattr(memory_probes, "_nvml_state", {"module": fake})
    assert nvml_unavailable_reason() is None
    assert gpu_process_memory() == 400 << 20
    assert gpu_process_memory(pid=2) is None


def test_background_sampler_peak_and_broken_probe() -> None:
    now = [0.0]
    values = iter([1.0, 5.0, 3.0])
    sampler = BackgroundSampler({"x": lambda: next(values), "broken": lambda: 1 / 0}, clock=lambda: now[0])
    for t in (1.0, 2.0, 3.0):
        now[0] = t
        sampler.sample_once()
    assert sampler.peak("x", 0.0, 10.0) == 5.0
    assert sampler.peak("x", 2.5, 10.0) == 3.0
    assert sampler.peak("broken", 0.0, 10.0) is None


def test_resource_monitor_on_cpu() -> None:
    with ResourceMonitor(cuda_device=None, unified=True, tegrastats=False) as monitor:
        window = monitor.begin()
        block = bytearray(32 << 20)
        block[::4096] = b"\x01" * len(block[::4096])
        memory, power = monitor.end(window)
        del block
    assert power is None
    assert memory.rss_peak_bytes is not None and memory.rss_baseline_bytes is not None
    assert memory.rss_delta_bytes == max(0, memory.rss_peak_bytes - memory.rss_baseline_bytes)
    if memory.rss_peak_scope == "combination":
        assert memory.rss_delta_bytes >= 16 << 20
    assert memory.gpu_allocated_peak_bytes is None
    assert memory.unified_used_peak_bytes is not None  # sampled at begin and end at least
