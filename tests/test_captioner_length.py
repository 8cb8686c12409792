"""``Captioner`` with a length level: LaBERT decodes at the asked level, a ``*-len`` bundle at its recorded default;
bad levels fail clearly."""

from __future__ import annotations

import pytest
import torch

from edgecap.runtime.bundle import load_bundle
from edgecap.runtime.captioner import Captioner
from edgecap.runtime.captioning import decode_cfg_for
from edgecap.runtime.vocab import build_vocab
from edgecap.workshop.export.bundle import export_bundle
from edgecap.workshop.models import LengthLevelError, create_model
from edgecap.workshop.torch_runtime.refine import TorchRefineModel
from edgecap.workshop.torch_runtime.runtime import TorchStepModel
from tests.runtime.bundle.helpers import pixel_run


def _vocab():
    return build_vocab([["a", "dog", "on", "the", "red", "sofa"]] * 5, kind="word", min_count=1)


def test_labert_caption_respects_the_level_bound_and_rejects_bad_levels() -> None:
    vocab = _vocab()
    torch.manual_seed(0)
    model = create_model("labert-test", vocab_size=vocab.size, feature_dim=8).eval()
    cfg = decode_cfg_for(vocab, strategy="mask_predict", length_level=2)
    cap = Captioner(None, TorchRefineModel(model), vocab, cfg)
    inputs = {"features": torch.randn(2, 3, 8), "boxes": torch.rand(2, 3, 4)}
    for level, (_, high) in enumerate(model.levels, start=1):
        assert all(len(c.split()) <= high for c in cap.caption_inputs(inputs, length_level=level))
    with pytest.raises(LengthLevelError, match="1..4"):
        cap.caption_inputs(inputs, length_level=7)


def test_length_level_on_a_model_without_length_control_is_refused() -> None:
    vocab = _vocab()
    model = create_model("ort-test", vocab_size=vocab.size, feature_dim=8)
    cap = Captioner(None, TorchStepModel(model), vocab, decode_cfg_for(vocab, beam_size=1))
    with pytest.raises(LengthLevelError, match="no length control"):
        cap.caption_inputs({"features": torch.randn(1, 3, 8), "boxes": torch.rand(1, 3, 4)}, length_level=2)


@pytest.mark.usefixtures("flush_denormals")
@pytest.mark.parametrize(
    ("model_name", "overrides"),
    [("ort-test", {"length_levels": "4level"}), ("expansionnet-test-len", {})],
    ids=["ort-test+4level", "expansionnet-test-len"],
)
def test_a_length_aware_bundle_decodes_at_its_recorded_default_level(
    tiny_data, tmp_path_factory, tmp_path, model_name, overrides
):
    """A ``*-len`` bundle (any autoregressive family) records its plan and default level at export; ``cap(image)``
    needs no level, every level decodes on ONNX Runtime as in torch, and a level outside the plan is refused by name
    (not by an ONNX Runtime index error). INT8 calibration decodes the calibration images at every level."""
    run, weights = pixel_run(tiny_data, tmp_path_factory, model_name, overrides)
    bundle = export_bundle(
        run,
        tmp_path / "len",
        backbone_weights=weights,
        int8=True,
        calib=tiny_data[0],
        calib_size=8,
        int8_step="static",  # the step scheme calibrated on decoder feeds, recorded at every level
        quality_images=0,
        progress=False,
    )
    assert load_bundle(bundle).interface["length"] == {
        "levels": [[1, 9], [10, 14], [15, 19], [20, 25]],
        "default_level": 2,
    }
    image = sorted((tiny_data[0] / "images").iterdir())[0]
    reference = Captioner.from_run(run, backbone_weights=weights)  # torch
    expected = reference(image)  # default level
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32") as cap:
        assert cap(image) == cap(image, length_level=2) == expected
        for level in (1, 4):
            assert cap(image, length_level=level) == reference(image, length_level=level)
        with pytest.raises(LengthLevelError, match=r"1\.\.4"):
            cap(image, length_level=5)
    calibration = load_bundle(bundle).variant("int8")["calibration"]
    assert calibration["images"] == 8 and calibration["report"]["decoder_feeds"] > 0
    with Captioner.load(bundle, runtime="onnxruntime", precision="int8") as cap:
        assert all(isinstance(cap(image, length_level=level), str) for level in (1, 2, 3, 4))
