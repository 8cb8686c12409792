"""Shared fixtures of the engine tests: each family's tiny graphs (exported once per session) and stand-ins for the
``tensorrt`` module and the GPU, which no machine of this project has."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from edgecap.engines.graphs import read_graph_io

#: family test config -> the runtime roles of its exported graphs
FAMILIES = ("ort-test", "expansionnet-test", "labert-test")


@pytest.fixture(scope="session")
def family_graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Per family: the manifest-style ``dims`` of its export spec, ``runtime_graphs`` and each runtime graph's I/O
    (features-in, so the region axis is dynamic; FP32 only, no parity: the graphs' shapes are what is tested)."""
    import torch

    from edgecap.export import export_onnx
    from edgecap.models import create_model

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


def fake_trt(version: str, *, strongly_typed: bool = True, weak_flags: bool = True) -> Any:
    """A stand-in ``tensorrt`` module with only the attributes the settings logic reads."""
    creation = SimpleNamespace(STRONGLY_TYPED=0) if strongly_typed else SimpleNamespace()
    flags = SimpleNamespace(FP16="FP16", INT8="INT8", TF32="TF32") if weak_flags else SimpleNamespace(TF32="TF32")
    return SimpleNamespace(__version__=version, NetworkDefinitionCreationFlag=creation, BuilderFlag=flags)
