"""The real onnxruntime-gpu wheel whose CUDA and TensorRT providers cannot start (no driver, no TensorRT): edgecap
captions on the CPU with the captions the CPU provider gives at FP32, and says why, with torch importable and without.

``Captioner.load(bundle, runtime="auto")`` plans for TensorRT (FP16: the bundle holds FP16 graphs), ONNX Runtime
falls back to the CPU, and the load must be planned again: FP32, the CPU's threads, reasons about the CPU, the cause
in ``runtime_info["provider_fallback"]``. With torch importable the runtime used to bind its tensors on a CUDA device
("Found no NVIDIA driver"); without torch it must run too (an edge install).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

TRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"
ROOT = Path(__file__).resolve().parents[2]

#: ``import torch`` fails in the process (an install without torch), then the bundle is captioned.
NO_TORCH = "import sys; sys.modules['torch'] = None  # import torch raises ImportError\n"
LOAD = """
import json, warnings
from edgecap import Captioner
bundle, *images = sys.argv[1:]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cap = Captioner.load(bundle, runtime="auto")
with cap:
    said = [str(w.message) for w in caught if w.category.__name__ == "ProviderFallbackWarning"]
    print(json.dumps({"captions": cap.batch(images), "info": cap.runtime_info, "warnings": said}, default=str))
"""
CLI = "from edgecap.cli import main\nmain(prog_name='edgecap')\n"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _check_info(info: dict[str, Any]) -> None:
    """What runs is what ``runtime_info`` says, and why."""
    assert info["runtime"] == "onnxruntime" and info["providers"] == [CPU] and info["device"] == "cpu"
    assert info["precision"] == "fp32", info["precision_reason"]  # not the FP16 planned for TensorRT
    assert info["precision_reason"].startswith("CPU:") and "TensorRT" not in info["precision_reason"]
    assert info["provider_reason"].startswith(f"{CPU}: ONNX Runtime fell back from {TRT}")
    assert info["threads"]["intra_op"] >= 1
    fallback = info["provider_fallback"]
    assert fallback["requested"] == [TRT, CUDA, CPU] and fallback["in_use"] == [CPU]
    cause = fallback["cause"]
    assert cause.startswith("TensorRT: ") and "; CUDA: " in cause and "gave no reason" not in cause, cause


def test_the_fake_of_the_unit_tests_behaves_as_this_wheel(case: dict[str, Any], capfd) -> None:
    """tests/runtime/backends/fake_onnxruntime_gpu.py: the same names and signatures, and the same streams for the same
    notices."""
    import onnxruntime

    from tests.runtime.backends.fake_onnxruntime_gpu import FailingGpuOnnxRuntime, surface_mismatches

    assert surface_mismatches(FailingGpuOnnxRuntime(onnxruntime), onnxruntime) == []
    graph = next(Path(case["bundle"]).rglob("*.onnx"))
    session = onnxruntime.InferenceSession(str(graph), providers=[TRT, CUDA, CPU])
    out, err = capfd.readouterr()
    assert session.get_providers() == [CPU]
    assert "EP Error" in out and "Falling back to ['CUDAExecutionProvider', 'CPUExecutionProvider']" in out
    assert "libonnxruntime_providers_tensorrt.so with error: " in err
    assert "libonnxruntime_providers_cuda.so with error: " in err


def test_auto_captions_on_the_cpu_with_torch_imported(case: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")  # imported first, as an application using torch would
    assert not torch.cuda.is_available()
    from edgecap import Captioner

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = Captioner.load(case["bundle"], runtime="auto")
    with cap:
        _check_info(cap.runtime_info)
        assert cap.batch(case["images"]) == case["expected"]
    said = [w for w in caught if w.category.__name__ == "ProviderFallbackWarning"]
    assert len(said) == 1 and "running on CPU" in str(said[0].message)


def test_auto_captions_on_the_cpu_without_torch(case: dict[str, Any]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH + LOAD, case["bundle"], *case["images"]],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)  # ONNX Runtime's notices stayed off stdout
    _check_info(result["info"])
    assert result["captions"] == case["expected"] and len(result["warnings"]) == 1


@pytest.mark.parametrize("torch", [True, False], ids=["torch", "no-torch"])
def test_edgecap_caption_says_once_why_it_runs_on_the_cpu(case: dict[str, Any], torch: bool) -> None:
    code = CLI if torch else NO_TORCH + CLI
    args = ["caption", "--model", case["bundle"], "--json", *case["images"]]
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == dict(zip(case["images"], case["expected"], strict=True))
    said = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(said) == 1, proc.stderr
    assert said[0].startswith("warning: ONNX Runtime is running on CPU: TensorRT, CUDA did not start (TensorRT: ")
