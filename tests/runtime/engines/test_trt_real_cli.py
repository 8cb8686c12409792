"""``edgecap engine`` and ``edgecap caption --runtime tensorrt`` with NVIDIA's real TensorRT 10.3 bindings installed
as ``tensorrt`` (the meta package's shim over ``tensorrt_bindings``) but no CUDA: the libraries' entry points return
NULL (:mod:`tests.runtime.engines.real_trt`), as on a machine without a driver or with a CUDA mismatch. Each command
must exit
non-zero with one message and no traceback: as this machine is (whatever cuda-python says about the GPU), and with the
GPU check passing (``current_env`` answering for an Orin), so that the real ``trt.Builder``/``trt.Runtime`` is reached
and fails. Skipped only when the package index cannot be reached (or off Linux)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import edgecap.runtime.engines.build as build
from tests.runtime.bundle.helpers import copy_bundle, pixel_bundle
from tests.runtime.engines.real_trt import RealTrt, RegistryUnreachableError, cache_root, prepare, unsupported_platform

#: The CLI in a subprocess; with ``gpu`` first, edgecap believes an Orin is here (the GPU checks answer for it).
CLI = """
import sys
if sys.argv[1] == "gpu":
    import dataclasses
    import edgecap.runtime.engines.build as build
    import edgecap.runtime.engines.cuda as cuda
    import edgecap.runtime.backends.registry as registry
    from edgecap.runtime.engines.store import EngineEnv

    build.current_env = lambda trt, device=0: EngineEnv(str(trt.__version__), "Orin", "8.7")
    cuda.set_device = lambda device: None
    spec = registry.get_runtime("tensorrt")
    registry._REGISTRY["tensorrt"] = dataclasses.replace(spec, requires=("tensorrt",))
from edgecap.cli import main
main(sys.argv[2:], prog_name="edgecap")
"""


@pytest.fixture(scope="module")
def real_10_3(request: pytest.FixtureRequest) -> RealTrt:
    reason = unsupported_platform()
    if reason:
        pytest.skip(reason)
    try:
        return prepare("10.3", cache_root(request))
    except RegistryUnreachableError as exc:
        pytest.skip(f"the real TensorRT bindings cannot be downloaded: {exc}")


@pytest.fixture
def bundle(tiny_data, tmp_path_factory, tmp_path) -> Path:
    return copy_bundle(pixel_bundle(tiny_data, tmp_path_factory)[0], tmp_path / "bundle")


def _run(real: RealTrt, mode: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", CLI, mode, *args], capture_output=True, text=True, env=real.env(), timeout=300
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Traceback" not in out, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("Error: ") and "\n\n" not in out.strip(), out  # one message, after any progress lines
    return last


def test_engine_with_tensorrt_that_cannot_start_cuda(real_10_3: RealTrt, bundle: Path) -> None:
    message = _run(real_10_3, "as-is", "engine", str(bundle), "--precision", "fp32", "--max-batch", "2")
    assert "CUDA" in message or "cuda-python" in message, message  # this machine's GPU check refuses first
    message = _run(real_10_3, "gpu", "engine", str(bundle), "--precision", "fp32", "--max-batch", "2")
    assert "Error: TensorRT 10.3.0 could not start: CUDA could not be initialised" in message, message
    assert not [p for p in (bundle / "engines").glob("*") if not p.name.startswith(".")]


def test_caption_with_tensorrt_that_cannot_start_cuda(real_10_3: RealTrt, bundle: Path, tiny_data, tensorrt_here):
    image = str(sorted((tiny_data[0] / "images").iterdir())[0])
    args = ["caption", image, "--model", str(bundle), "--runtime", "tensorrt", "--beam", "2"]
    message = _run(real_10_3, "as-is", *args)
    assert "tensorrt" in message.lower(), message
    tensorrt_here.use("10.3")  # an engine set this "Orin" fits, built by the fake: loading gets as far as trt.Runtime
    build.build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    message = _run(real_10_3, "gpu", *args)
    assert "runtime 'tensorrt': TensorRT 10.3.0 could not start: CUDA could not be initialised" in message, message
