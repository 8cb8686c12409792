"""Quantisation-aware training: fake quantisation that matches the INT8 presets, a QAT run, and its INT8 export."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from edgecap.workshop.compression.fake_quant import (
    attach_fake_quant,
    freeze_observers,
    module_role,
    remove_fake_quant,
    scheme_for,
)
from edgecap.workshop.compression.qat import QAT_SUMMARY, QatError, qat_run
from edgecap.workshop.export.calibration.presets import get_preset
from edgecap.workshop.training import checkpoint as ckpt


def _schemes(target: str) -> dict:
    preset = get_preset(target)
    return {role: scheme_for(preset, role) for role in ("encoder", "step")}


def test_the_scheme_follows_the_preset():
    trt = _schemes("tensorrt")["encoder"]
    assert trt.activation_dtype == "int8" and trt.activation_symmetric and trt.weight_bits == 8
    assert nn.Conv2d in trt.modules and nn.Linear in trt.modules
    avx2 = get_preset("cpu-avx2")
    assert scheme_for(avx2, "encoder").weight_bits == (7 if avx2.reduce_range else 8)
    assert scheme_for(avx2, "encoder").activation_dtype == avx2.activation_type
    assert scheme_for(get_preset("cpu-avx2").with_step_scheme("weight-only-4"), "step").describe() == {
        "modules": ["Linear"],
        "weights": "int4-symmetric-per-channel",
        "activations": "float",
    }
    assert module_role("decoder.layers.0.fc1") == "step" and module_role("encoder.layers.0.fc1") == "encoder"


def test_weights_land_on_a_symmetric_per_channel_int8_grid():
    torch.manual_seed(0)
    layer = nn.Linear(16, 6)
    attach_fake_quant(layer, _schemes("tensorrt"), role="encoder")
    layer(torch.randn(4, 16))  # observers see the weights and the input
    remove_fake_quant(layer)
    assert not parametrize.is_parametrized(layer) and set(layer.state_dict()) == {"weight", "bias"}
    w = layer.weight.detach()
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    levels = w / scale
    assert torch.allclose(levels, levels.round(), atol=1e-3)  # every weight is k·scale, |k| <= 127
    assert all(len(row.unique()) <= 255 for row in levels.round())


def test_a_conv_followed_by_batchnorm_is_quantised_folded():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    net[1].running_var.uniform_(0.5, 2.0)
    net[1].weight.data.uniform_(0.5, 2.0)
    net.eval()
    attach_fake_quant(net, _schemes("tensorrt"), role="encoder")
    net(torch.randn(2, 3, 8, 8))
    remove_fake_quant(net)
    bn = net[1]
    folded = net[0].weight.detach() * (bn.weight / torch.sqrt(bn.running_var + bn.eps)).reshape(-1, 1, 1, 1)
    levels = folded / (folded.abs().amax(dim=(1, 2, 3), keepdim=True) / 127)
    assert torch.allclose(levels, levels.round(), atol=1e-3)  # the graph's folded weight is on the grid


def test_activations_are_fake_quantised_with_the_preset_range():
    torch.manual_seed(0)
    layer = nn.Linear(8, 8)
    x = torch.randn(32, 8)
    attach_fake_quant(layer, _schemes("tensorrt"), role="encoder")
    layer(x)  # observes the range
    freeze_observers(layer)
    fq = layer.input_fake_quant
    scale, zero = fq.calculate_qparams()
    step = float(scale)
    assert step == pytest.approx(float(x.abs().max()) / 127, rel=0.05)  # symmetric signed range of the input
    snapped = torch.round(x / step) * step
    # an input moved by less than half a step lands on the same level: the layer sees the quantised input
    assert torch.equal(layer(snapped + 0.3 * step), layer(snapped))
    assert int(zero) == 0  # zero point 0 (TensorRT)


def test_a_qat_run_records_its_parent_and_leaves_it_alone(tiny_parent_run, tmp_path):
    before = (tiny_parent_run / ckpt.WEIGHTS).read_bytes()
    out = qat_run(tiny_parent_run, tmp_path / "qat", epochs=1, target="tensorrt", lr=1e-4, max_steps=3, progress=False)
    config = json.loads((out / ckpt.CONFIG).read_text())
    step = config["compression"][-1]
    assert step["kind"] == "qat" and step["parent"] == str(tiny_parent_run.resolve()) and step["steps"] == 3
    assert step["layers"] > 0 and step["end_to_end"] is False and json.loads((out / QAT_SUMMARY).read_text())
    assert (tiny_parent_run / ckpt.WEIGHTS).read_bytes() == before
    with pytest.raises(QatError, match="exists"):
        qat_run(tiny_parent_run, out, epochs=1, progress=False)
    assert not list(tmp_path.glob(".qat.partial*"))


@pytest.mark.slow
def test_the_qat_run_exports_to_qdq_int8_that_decodes_like_the_fake_quant_model(
    tiny_parent_run, tiny_data, tmp_path, monkeypatch
):
    """ONNX Runtime's INT8 graphs of a QAT run against the fake-quantised torch model it was trained as: the
    export's task-level check is pointed at that model (ranges from the same calibration images)."""
    import edgecap.workshop.export.bundle as bundle_module
    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.data.sources import open_feature_source
    from edgecap.workshop.export.bundle import export_bundle
    from edgecap.workshop.runs import load_run
    from edgecap.workshop.training.batches import FeatureBank, encode_captions

    data, _ = tiny_data
    out = qat_run(tiny_parent_run, tmp_path / "qat", epochs=1, target="tensorrt", lr=1e-4, max_steps=3, progress=False)
    run = load_run(out)
    model = run.model.eval()
    attach_fake_quant(model, _schemes("tensorrt"))
    records = load_dataset(data).split("train")[:8]
    bank = FeatureBank(open_feature_source(run.config["features"]), [r.image_id for r in records])
    with torch.no_grad():
        for rows in (torch.arange(0, 4), torch.arange(4, 8)):
            visual = bank.batch(rows)
            memory = model.encode_memory(visual.features, visual.boxes, visual.mask)
            tokens = encode_captions(run.vocab, [records[int(r)].captions[0] for r in rows], 12)
            model.decode_full(memory, visual.mask, tokens[:, :-1])  # the decoder's ranges, teacher-forced
    freeze_observers(model)
    monkeypatch.setattr(bundle_module, "reference_source", lambda *args: (model, "fake-quant torch", None))
    bundle = export_bundle(out, tmp_path / "bundle", int8=True, calib=data, calib_size=8, target="tensorrt",
                           quality_images=8, progress=False)  # fmt: skip
    quality = json.loads((bundle / "manifest.json").read_text())["variants"]["int8"]["quality"]
    # Both quantise the same on-grid weights; activation ranges come from different estimators (a moving average
    # in torch, ONNX Runtime's calibration at export), so near-ties may flip: most tokens agree.
    assert quality["token_agreement"] >= 0.8, quality


def test_a_run_on_backbone_features_is_fine_tuned_end_to_end_with_its_backbone(tiny_data, tmp_path_factory, tmp_path):
    """Pixels-in bundles quantise the backbone too: QAT fine-tunes it from images, fake-quantised, and the new run
    names the tuned backbone file (which export then uses without --backbone-weights)."""
    from safetensors.torch import load_file, save_file

    from edgecap.workshop.data.feature_cache import extract_features
    from edgecap.workshop.export.bundling.source import _tuned_backbone_file
    from edgecap.workshop.models.backbone import create_backbone
    from edgecap.workshop.runs import load_run
    from edgecap.workshop.torch_runtime.images import backbone_from_spec
    from edgecap.workshop.training.loop import train
    from tests.workshop.training.helpers import tiny_train_cfg

    data, _ = tiny_data
    root = tmp_path_factory.mktemp("qat-pixels")
    torch.manual_seed(0)
    weights = root / "backbone.safetensors"
    save_file(create_backbone("test_efficientnet", pretrained=False, image_size=64).model.state_dict(), str(weights))
    cache = root / "cache"
    extract_features(data, cache, "test_efficientnet", image_size=64, weights=weights, progress=False, batch_size=20,
                     num_workers=0)  # fmt: skip
    parent = train(
        tiny_train_cfg((data, cache), root / "run", max_steps=2, backbone_weights=str(weights)), progress=False
    )
    out = qat_run(parent, tmp_path / "qat", epochs=1, target="tensorrt", lr=1e-4, max_steps=2, progress=False)
    config = json.loads((out / ckpt.CONFIG).read_text())
    assert config["compression"][-1]["end_to_end"] is True
    tuned = load_file(str(out / "backbone.safetensors"))
    assert any(not torch.equal(tuned[k], v) for k, v in load_file(str(weights)).items() if k in tuned)
    backbone_from_spec(config["backbone"], weights=out / "backbone.safetensors")  # the spec proves the file
    assert _tuned_backbone_file(load_run(out)) == out / "backbone.safetensors"
