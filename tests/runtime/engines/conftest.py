"""Shared fixtures of the engine tests: each family's tiny graphs (exported once per session) and stand-ins for the
``tensorrt`` module (generated from TensorRT's recorded surface, :mod:`tests.runtime.engines.fake_trt`) and the GPU
(:mod:`tests.runtime.engines.simulated_device`), which no machine of this project has."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from edgecap.runtime.engines.graphs import read_graph_io
from tests.runtime.engines.fake_trt import Faults, fake_tensorrt

#: family test config -> the runtime roles of its exported graphs
FAMILIES = ("ort-test", "expansionnet-test", "labert-test")


@pytest.fixture(scope="session")
def family_graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Per family: the manifest-style ``dims`` of its export spec, ``runtime_graphs`` and each runtime graph's I/O
    (features-in, so the region axis is dynamic; FP32 only, no parity: the graphs' shapes are what is tested)."""
    import torch

    from edgecap.workshop.export import export_onnx
    from edgecap.workshop.models import create_model

    root = tmp_path_factory.mktemp("engine-graphs")
    out = {}
    for name in FAMILIES:
        torch.manual_seed(0)
        model = create_model(name, vocab_size=40, feature_dim=24).eval()
        result = export_onnx(model, root / name, precisions=("fp32",), parity=False, simplify="none")
        spec = result.spec
        out[name] = {
            "dims": {n: {"min": d.min, "max": d.max} for n, d in spec.dims.items()},
            "roles": dict(spec.runtime_graphs),
            "io": {role: read_graph_io(root / name / "fp32" / f"{g}.onnx") for role, g in spec.runtime_graphs.items()},
            "state_names": tuple(spec.state_names),
            "updated": tuple(spec.step_state_names),
            "max_len": int(model.max_len),
        }
    return out


class TensorRTHere:
    """This test's TensorRT and GPU: a fake ``tensorrt`` in ``sys.modules`` and what ``gpu_info`` reports."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch
        self.gpu = ("Orin", "8.7")
        self.trt: Any = None
        self.use("10.3")

    def use(self, version: str, *, faults: Faults | None = None, version_string: str | None = None) -> Any:
        """Install the fake of a recorded version (``10.3``, ``10.16``, ``11.4``) as ``tensorrt``; returns it."""
        self.trt = fake_tensorrt(version, faults=faults, version_string=version_string)
        self._monkeypatch.setitem(sys.modules, "tensorrt", self.trt)
        return self.trt


@pytest.fixture
def tensorrt_here(monkeypatch: pytest.MonkeyPatch) -> TensorRTHere:
    """TensorRT 10.3 on a Jetson Orin as far as edgecap can tell (the fake module, a simulated current device);
    ``tensorrt_here.use(...)`` and ``tensorrt_here.gpu`` change them."""
    import edgecap.runtime.engines.cuda as cuda
    from tests.runtime.engines import simulated_device as sim

    here = TensorRTHere(monkeypatch)
    monkeypatch.setattr(cuda, "gpu_info", lambda device=0: cuda.GpuInfo(device, *here.gpu))
    monkeypatch.setattr(cuda, "set_device", sim.set_device)
    return here
