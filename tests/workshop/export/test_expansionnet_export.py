"""ExpansionNet-specific export checks; the generic ones (parity per graph and precision, interface, fp16 policy,
beam search on ONNX Runtime) run on ``expansionnet-test`` through the registry-parametrised tests."""

from __future__ import annotations

import onnx
import pytest
import torch

from edgecap.workshop.export.onnx import export_onnx
from edgecap.workshop.export.parity import check_graph
from edgecap.workshop.models import create_model
from tests.workshop.export.helpers import BACKBONE, BACKBONE_SIZE, exported

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.mark.slow
def test_backbone_in_the_encoder_graph() -> None:
    from edgecap.workshop.models.backbone import create_backbone

    torch.manual_seed(0)
    backbone = create_backbone(BACKBONE, pretrained=False, image_size=BACKBONE_SIZE).eval()
    model = create_model("expansionnet-test", vocab_size=20, feature_dim=backbone.feature_dim).eval()
    result = export_onnx(model, backbone=backbone, name="expansionnet-test+backbone", graphs=["init"])
    assert result.spec.decode_inputs == ("pixel_values",)
    for precision in ("fp32", "fp16"):
        for graph in ("encoder", "start", "init"):
            report = check_graph(result.spec, graph, result.model(graph, precision), precision, seed=5)
            assert report["passed"], (graph, precision, report["outputs"])


@pytest.mark.slow
def test_expansion_normalisation_stays_fp32_in_fp16_graphs() -> None:
    """Every Ψ division (and its ε clip) reads float32 tensors in the fp16 step graph."""
    step = onnx.shape_inference.infer_shapes(exported("expansionnet-test").model("step", "fp16"))
    types = {v.name: v.type.tensor_type.elem_type for v in (*step.graph.value_info, *step.graph.input)}
    divs = [n for n in step.graph.node if n.op_type == "Div"]
    clips = [n for n in step.graph.node if n.op_type == "Clip"]
    assert divs and clips
    for node in (*divs, *clips):
        assert types.get(node.input[0]) == onnx.TensorProto.FLOAT, node.name
