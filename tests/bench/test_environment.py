"""The environment block: parsers on sample texts, and the captured block's fields."""

from __future__ import annotations

import json

from edgecap.bench.environment import capture_environment, cpu_model, parse_cpuinfo, parse_nvpmodel, physical_cores

X86 = """processor\t: 0
model name\t: AMD EPYC 7B13
physical id\t: 0
core id\t\t: 0

processor\t: 1
model name\t: AMD EPYC 7B13
physical id\t: 0
core id\t\t: 0

processor\t: 2
model name\t: AMD EPYC 7B13
physical id\t: 0
core id\t\t: 1
"""

JETSON = """processor\t: 0
model name\t: ARMv8 Processor rev 1 (v8l)
BogoMIPS\t: 62.50
CPU implementer\t: 0x41
CPU part\t: 0xd42

processor\t: 1
CPU implementer\t: 0x41
CPU part\t: 0xd42
"""

ARM_NO_NAME = "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd08\n"


def test_cpuinfo_parsing() -> None:
    blocks = parse_cpuinfo(X86)
    assert len(blocks) == 3 and blocks[2]["core id"] == "1"
    assert cpu_model(X86) == "AMD EPYC 7B13"
    assert cpu_model(JETSON) == "ARMv8 Processor rev 1 (v8l)"
    assert cpu_model(ARM_NO_NAME) == "ARM implementer 0x41 part 0xd08"


def test_nvpmodel_parsing() -> None:
    assert parse_nvpmodel("NV Power Mode: MAXN\n0\n") == "MAXN (id 0)"
    assert parse_nvpmodel("NVPM WARN: ...\nNV Power Mode: 15W\n") == "15W"
    assert parse_nvpmodel("nvpmodel: command not found") is None


def test_capture_environment_is_json_and_complete() -> None:
    env = capture_environment()
    json.dumps(env)  # strict-JSON-able
    for key in ("cpu", "logical_cpus", "usable_cpus", "versions", "torch_threads", "gpus", "jetson", "power_mode"):
        assert key in env
    assert env["versions"]["edgecap"] and env["versions"]["torch"]
    assert env["usable_cpus"] >= 1
    assert env["physical_cores"] == physical_cores() and 1 <= env["physical_cores"] <= env["logical_cpus"]
    assert env["memory_bytes"] > 0


def test_the_providers_line_reads_today_s_key_and_the_one_older_reports_wrote() -> None:
    from edgecap.bench.markdown import _environment_lines

    env = capture_environment()
    assert "onnxruntime_providers" in env and "ort_providers" not in env
    for record in ({"onnxruntime_providers": ["CPUExecutionProvider"]}, {"ort_providers": ["CPUExecutionProvider"]}):
        assert "- ONNX Runtime providers: CPUExecutionProvider" in _environment_lines(record)
    assert "- ONNX Runtime providers: onnxruntime not installed" in _environment_lines({"onnxruntime_providers": None})
