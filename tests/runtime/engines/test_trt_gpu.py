"""Real TensorRT engines on a real GPU: build from a tiny bundle, caption, compare with ONNX Runtime on the CPU.

Skipped, with the reason, wherever TensorRT or a CUDA GPU is missing. TensorRT installs from PyPI
(``tensorrt-cu12``/``tensorrt-cu13`` bring NVIDIA's real libraries), but every machine these tests have met so far had
no GPU, or no TensorRT where a GPU was lent, so they have never run (``docs/tensorrt.md``). Run on a GPU machine with
TensorRT >= 10.3 and cuda-python, e.g. ``pip install -e '.[dev,tensorrt-cu12]'`` (or ``-cu13``, the driver's CUDA):
``python -m pytest -m trt tests/runtime/engines/test_trt_gpu.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecap import Captioner
from tests.runtime.bundle.helpers import copy_bundle, pixel_bundle

pytestmark = [pytest.mark.trt, pytest.mark.gpu]

pytest.importorskip(
    "tensorrt", reason="TensorRT is not installed (its libraries install only from NVIDIA's package index)"
)


def _gpu_reason() -> str:
    from edgecap.runtime.engines.cuda import CudaUnavailableError, gpu_info

    try:
        gpu_info()
    except CudaUnavailableError as exc:
        return str(exc)
    return ""


if _gpu_reason():
    pytest.skip(f"needs a CUDA GPU: {_gpu_reason()}", allow_module_level=True)


@pytest.fixture(scope="module")
def bundle(tiny_data, tmp_path_factory) -> Path:
    return copy_bundle(pixel_bundle(tiny_data, tmp_path_factory)[0], tmp_path_factory.mktemp("trt") / "bundle")


@pytest.fixture(scope="module")
def images(tiny_data) -> list[Path]:
    return sorted((tiny_data[0] / "images").iterdir())[:6]


def test_fp32_engines_caption_like_onnx_runtime(bundle: Path, images) -> None:
    from edgecap.runtime.engines import build_engines

    result = build_engines(bundle, precision="fp32", max_batch=4, beam=3)
    assert result.built and build_engines(bundle, precision="fp32", max_batch=4, beam=3).built is False
    with Captioner.load(bundle, runtime="onnxruntime", providers=["cpu"], precision="fp32") as cap:
        expected = cap.batch(images, batch_size=4)
    with Captioner.load(bundle, runtime="tensorrt", precision="fp32") as cap:
        assert cap.runtime_info["engines"] == str(result.folder)
        got = cap.batch(images, batch_size=4)
    agreement = sum(a == b for a, b in zip(got, expected, strict=True)) / len(expected)
    assert agreement >= 5 / 6, (got, expected)  # TF32/kernel choices may flip a near tie, not most captions
