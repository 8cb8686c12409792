"""The real onnxruntime-gpu wheel on a machine where its GPU providers cannot start (``.ci/onnxruntime-gpu``).

Every test here is marked ``onnxruntime_gpu_fallback`` and skipped unless the installed onnxruntime lists the CUDA
provider and that provider's library cannot be loaded here (no NVIDIA driver, no CUDA libraries): the default suite,
on the CPU onnxruntime or on a machine whose GPU works, skips them. ``EDGECAP_REQUIRE_ONNXRUNTIME_GPU_FALLBACK=1`` (set
by the CI job) turns the skip into a failure, so the job cannot pass without running them.

The case (bundle, images, the CPU provider's captions) comes from ``EDGECAP_ONNXRUNTIME_GPU_CASE`` (a directory
:mod:`tests.gpu_fallback.make_case` wrote, with the development environment's CPU onnxruntime), else it is built here.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest

MARK = "onnxruntime_gpu_fallback"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}: needs onnxruntime-gpu whose GPU providers cannot start here")


def why_not_here() -> str | None:
    """Why this machine cannot show the fallback, or None when it can."""
    if importlib.util.find_spec("onnxruntime") is None:
        return "onnxruntime is not installed"
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return "this onnxruntime build has no CUDA provider (the CPU wheel)"
    from edgecap.runtime.backends.onnxruntime.fallback import provider_library_error

    if provider_library_error(onnxruntime, "CUDAExecutionProvider") is None:
        return "the CUDA provider's library loads here: the GPU providers may start, so there is no fallback to test"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    mine = [item for item in items if here in Path(str(item.fspath)).parents]
    if not mine:
        return
    reason = why_not_here()
    if reason is not None and os.environ.get("EDGECAP_REQUIRE_ONNXRUNTIME_GPU_FALLBACK") == "1":
        raise pytest.UsageError(f"the onnxruntime-gpu fallback tests must run here, but {reason}")
    for item in mine:
        item.add_marker(MARK)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def case(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``{"bundle", "images", "expected"}``: a bundle with FP32 and FP16 graphs, images, their CPU captions."""
    given = os.environ.get("EDGECAP_ONNXRUNTIME_GPU_CASE")
    if given:
        return json.loads((Path(given) / "case.json").read_text())
    pytest.importorskip(
        "torch", reason="building the case exports a bundle (torch); or set EDGECAP_ONNXRUNTIME_GPU_CASE"
    )
    from tests.gpu_fallback.make_case import make_case

    return make_case(tmp_path_factory.mktemp("case"))
