"""The GPU check job (``tools.gpu_check``): the CUDA tests, CUDA vs CPU parity, FP16/BF16 agreement and
CIDEr-D, eager vs CUDA-graph throughput, the GPU execution providers and LaBERT per length level, every section in
its own process within a 270 s budget. It takes minutes, so it runs only when asked for, on a CUDA machine::

    EDGECAP_GPU_CHECK_RUN=RUN_DIR EDGECAP_GPU_CHECK_OUT=OUT_DIR \\
        python -m pytest -m gpu_check tests/gpu/test_gpu_check.py

``RUN_DIR``: a trained run (without it, random-weights acort-xsmall, whose agreement and CIDEr-D mean nothing);
``OUT_DIR`` gets ``env.json``, ``<section>.json``, the logs and ``summary.md`` (default: a temporary folder).
``EDGECAP_GPU_CHECK_DATA``: the dataset whose test split is captioned; ``EDGECAP_GPU_CHECK_BUDGET``: the budget in
seconds. ``python -m tools.gpu_check --help`` runs the same check without pytest.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools import gpu_check

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_check]


def test_gpu_check(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Every section finishes within its budget (``summary.md`` says which did not, and why)."""
    if "gpu_check" not in (request.config.option.markexpr or ""):
        pytest.skip("minutes on a GPU: python -m pytest -m gpu_check tests/gpu/test_gpu_check.py")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    out = Path(os.environ.get("EDGECAP_GPU_CHECK_OUT") or tmp_path)
    args = ["--out", str(out), "--budget", os.environ.get("EDGECAP_GPU_CHECK_BUDGET", "270")]
    for variable, flag in (("EDGECAP_GPU_CHECK_RUN", "--run"), ("EDGECAP_GPU_CHECK_DATA", "--data")):
        if os.environ.get(variable):
            args += [flag, os.environ[variable]]
    status = gpu_check.main(args)
    assert status == 0, (out / "summary.md").read_text()
