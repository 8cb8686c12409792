"""The ORT/ACORT step graph with per-position caches (``ort_export_spec(cache_layout="per-layer")``): the same step
as the model's stacked cache bit for bit, graphs that pass parity, and ONNX Runtime decodes identical to torch's and
to the stacked layout's (so bundles of either layout decode the same captions)."""

from __future__ import annotations

import pytest
import torch

from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model
from edgecap.runtime.decoding import decode
from edgecap.workshop.export.onnx import export_onnx
from edgecap.workshop.export.specs.layer_caches import PerLayerCaches
from edgecap.workshop.export.specs.ort import ort_export_spec
from edgecap.workshop.torch_runtime.runtime import TorchStepModel
from tests.workshop.export.helpers import decode_cfg, random_images, tiny_model

# Share-KV (self_k only), separate values (self_k and self_v), a length-controlled model (level_embed in the state)
CONFIGS = ("acort-test", "ort-test", "acort-test-len")


@pytest.mark.parametrize("name", CONFIGS)
def test_per_layer_caches_step_exactly_like_the_stacked_cache(name: str) -> None:
    model = tiny_model(name)
    view = PerLayerCaches(model)
    images = random_images(2)
    level = (torch.tensor([1, 2]),) if model.length_levels else ()
    tokens = torch.tensor([3, 7])
    with torch.no_grad():
        memory = model.encode_memory(images["features"], images["boxes"], images["feature_mask"])
        stacked = model.start(memory, images["feature_mask"], *level)
        split = view.start(memory, images["feature_mask"], *level)
        assert set(split) == set(view.state_names) and not {"self_k", "self_v"} & set(split)
        for _ in range(3):
            expected, stacked = model.step(tokens, stacked)
            got, split = view.step(tokens, split)
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for i in range(len(model.decoder.layers)):
        torch.testing.assert_close(split[f"self_k{i}"], stacked["self_k"][:, i], rtol=0, atol=0)
        if "self_v" in stacked:
            torch.testing.assert_close(split[f"self_v{i}"], stacked["self_v"][:, i], rtol=0, atol=0)


def test_a_model_without_a_stacked_cache_is_refused() -> None:
    with pytest.raises(ValueError, match="ORT/ACORT decoder"):
        PerLayerCaches(tiny_model("expansionnet-test"))
    with pytest.raises(ValueError, match="unknown cache_layout"):
        ort_export_spec(tiny_model("acort-test"), cache_layout="ring")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["acort-test", "ort-test"])
def test_per_layer_graphs_decode_what_torch_and_the_stacked_graphs_decode(name: str) -> None:
    model = tiny_model(name)
    per_layer = export_onnx(spec=ort_export_spec(model, cache_layout="per-layer", name=name), precisions=["fp32"])
    assert per_layer.parity_passed
    step = per_layer.model("step", "fp32")
    inputs = [i.name for i in step.graph.input]
    assert "self_k" not in inputs and {"self_k0", "self_k1"} <= set(inputs)
    assert not [n for n in step.graph.node if n.op_type == "Split"]  # no copy of the cache into positions
    stacked = export_onnx(model, name=name, precisions=["fp32"], parity=False)  # the layout of earlier bundles
    images, cfg = random_images(3), decode_cfg(name)

    def tokens(step_model: object) -> list[list[int]]:
        return [[h.tokens for h in hyps] for hyps in decode(step_model, images, cfg)]

    expected = tokens(TorchStepModel(model))
    for result in (per_layer, stacked):
        graphs = result.runtime_models("fp32")
        with create_onnxruntime_step_model(graphs["encoder"], graphs["step"], intra_op_threads=1) as onnxruntime_model:
            assert tokens(onnxruntime_model) == expected
