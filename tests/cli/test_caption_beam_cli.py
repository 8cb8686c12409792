"""A beam asked of a mask-predict model (LaBERT) is refused, not ignored: ``Captioner.load``, ``from_run`` and
``edgecap caption`` say it does not apply, the way they refuse a length level on a model without length control."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgecap import Captioner
from edgecap.cli import main
from edgecap.runtime.captioner import NO_BEAM_SEARCH, CaptionerError
from tests.runtime.bundle.helpers import labert_bundle, pixel_run

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.fixture(scope="module")
def bundle(tiny_data, tmp_path_factory):
    return labert_bundle(tiny_data, tmp_path_factory)[0]


def test_load_refuses_a_beam_on_a_mask_predict_bundle(bundle):
    with pytest.raises(CaptionerError, match="mask-predict"):
        Captioner.load(bundle, runtime="onnxruntime", precision="fp32", beam=5)
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32") as cap:  # unset: its own decoding
        assert cap.runtime_info["decoding"] == "mask_predict"


def test_caption_refuses_beam_on_a_mask_predict_bundle(bundle, tiny_data):
    image = str(sorted((tiny_data[0] / "images").iterdir())[0])
    args = ["caption", image, "--model", str(bundle), "--runtime", "onnxruntime", "--precision", "fp32"]
    refused = CliRunner().invoke(main, [*args, "--beam", "5"])
    assert refused.exit_code == 1 and NO_BEAM_SEARCH.split(":")[0] in refused.output, refused.output
    assert CliRunner().invoke(main, args).exit_code == 0  # no --beam: captions as before


def test_from_run_refuses_a_beam_on_a_mask_predict_run(tiny_data, tmp_path_factory):
    run, weights = pixel_run(tiny_data, tmp_path_factory, "labert-test")
    with pytest.raises(CaptionerError, match="mask-predict"):
        Captioner.from_run(run, beam=5)
    assert Captioner.from_run(run, backbone_weights=weights).decode_cfg.strategy == "mask_predict"


def test_quickstart_refuses_a_beam_for_a_mask_predict_model_before_any_work(tmp_path):
    result = CliRunner().invoke(
        main, ["quickstart", "--model", "labert-test", "--beam", "5", "--workdir", str(tmp_path)]
    )
    assert result.exit_code == 1 and "mask-predict" in result.output, result.output
    assert list(tmp_path.iterdir()) == []
