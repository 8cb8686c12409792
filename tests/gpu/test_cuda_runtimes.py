"""CUDA paths: the torch runtime on a GPU and ONNX Runtime's CUDA execution provider with device I/O binding.

Skipped, with the reason, where no CUDA GPU (or no CUDA-enabled onnxruntime) exists; CI has neither. Run on a GPU
machine with ``python -m pytest -m gpu tests/gpu``; ``docs/benchmarks.md`` records where and when they last ran.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from edgecap import Captioner
from tests.runtime.bundle.helpers import pixel_bundle

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)


@pytest.fixture(scope="module")
def bundle(tiny_data, tmp_path_factory) -> Path:
    return pixel_bundle(tiny_data, tmp_path_factory)[0]


@pytest.fixture(scope="module")
def images(tiny_data) -> list[Path]:
    return sorted((tiny_data[0] / "images").iterdir())[:6]


@pytest.fixture(scope="module")
def cpu_captions(bundle, images) -> list[str]:
    with Captioner.load(bundle, runtime="onnxruntime", providers=["cpu"], precision="fp32") as cap:
        return cap.batch(images)


def _onnxruntime_cuda() -> bool:
    try:
        import onnxruntime
    except ImportError:
        return False
    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def _threaded(cap: Captioner, images: list[Path]) -> tuple[list[list[str]], list[list[str]]]:
    orders = [images[i:] + images[:i] for i in range(8)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda order: cap.batch(order, batch_size=2), orders))
    serial = cap.batch(images)
    return [[serial[images.index(p)] for p in order] for order in orders], got


def test_torch_runtime_on_cuda_gives_the_cpu_captions(bundle, images, cpu_captions):
    with Captioner.load(bundle, runtime="torch", device="cuda", precision="fp32") as cap:
        assert cap.runtime_info["device"].startswith("cuda")
        assert cap.batch(images) == cpu_captions


def test_torch_runtime_on_cuda_picks_fp16_and_decodes(bundle, images):
    with Captioner.load(bundle, runtime="torch", device="cuda") as cap:
        assert cap.runtime_info["precision"] == "fp16"
        assert cap.step_model.autocast_dtype == torch.float16  # autocast over FP32 weights (docs/gpu.md)
        captions = cap.batch(images)
    assert len(captions) == len(images) and all(captions)


def test_torch_runtime_on_cuda_is_thread_safe(bundle, images):
    with Captioner.load(bundle, runtime="torch", device="cuda", precision="fp32") as cap:
        expected, got = _threaded(cap, images)
    assert got == expected


@pytest.mark.skipif(not _onnxruntime_cuda(), reason="needs onnxruntime-gpu with the CUDA execution provider")
def test_onnxruntime_cuda_io_binding_gives_the_cpu_captions_from_several_threads(bundle, images, cpu_captions):
    with Captioner.load(bundle, runtime="onnxruntime", providers=["cuda"], precision="fp32") as cap:
        assert cap.runtime_info["providers"][0] == "CUDAExecutionProvider"
        assert cap.batch(images) == cpu_captions
        expected, got = _threaded(cap, images)
    assert got == expected
