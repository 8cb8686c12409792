"""INT8 graphs of an ExpansionNet captioner: every step scheme quantises the cached step, and INT8 decodes like FP32."""

from __future__ import annotations

import pytest
import torch

from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model
from edgecap.runtime.decoding import DecodeCfg
from edgecap.runtime.vocab import WordVocab
from edgecap.workshop.export.calibration import compare_decoders, quantize_int8


@pytest.fixture(scope="module")
def expansionnet(region_feeds):
    pytest.importorskip("onnxruntime")
    from edgecap.workshop.export import export_onnx
    from edgecap.workshop.models import create_model

    torch.manual_seed(0)
    vocab = WordVocab([f"w{i}" for i in range(26)])
    model = create_model("expansionnet-test", vocab_size=vocab.size, feature_dim=16).eval()
    with torch.no_grad():  # top-1 margins above int8 noise, like a trained model's
        model.output_proj.weight.mul_(4.0)
    result = export_onnx(model, None, precisions=["fp32"], parity=False)
    return result, vocab


#: step scheme -> the op its weight matmuls become (the x86 presets' default step scheme is dynamic)
STEP_OPS = {"static": "DequantizeLinear", "dynamic": "MatMulInteger", "weight-only": "MatMulNBits"}


@pytest.mark.parametrize("scheme", list(STEP_OPS))
def test_int8_quantises_the_cached_step_and_decodes_like_fp32(expansionnet, region_feeds, scheme) -> None:
    from edgecap.workshop.export.calibration import get_preset
    from edgecap.workshop.export.calibration.schemes import float_weight_matmuls

    result, vocab = expansionnet
    fp32 = result.runtime_models("fp32")
    cfg = DecodeCfg.for_vocab(vocab, strategy="beam", beam_size=2, max_len=6)
    preset = get_preset("cpu-avx2").with_step_scheme(scheme)
    int8 = quantize_int8(fp32, result.spec, region_feeds(4, batch=4, seed=1), cfg, preset, progress=False)
    step_ops = {n.op_type for n in int8.models["step"].graph.node}
    assert STEP_OPS[scheme] in step_ops  # the step's weight matmuls really are quantised
    if scheme != "static":
        assert float_weight_matmuls(int8.models["step"]) == []
    with (
        create_onnxruntime_step_model(fp32["encoder"], fp32["step"]) as ref,
        create_onnxruntime_step_model(int8.models["encoder"], int8.models["step"]) as cand,
    ):
        report = compare_decoders(ref, cand, region_feeds(3, batch=4, seed=9), None, vocab, cfg)
    assert report["images"] == 12
    assert report["token_agreement_pct"] >= 80.0
