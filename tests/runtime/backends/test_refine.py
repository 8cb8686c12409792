"""Mask-predict through the refine adapters: torch and ONNX Runtime give identical captions at fp32."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from edgecap.runtime.backends.base import RuntimeInputError
from edgecap.runtime.backends.onnxruntime.refine import create_onnxruntime_refine_model
from edgecap.runtime.decoding import DecodeCfg, decode
from edgecap.workshop.export.onnx import export_onnx
from edgecap.workshop.models import create_model
from edgecap.workshop.torch_runtime.refine import TorchRefineModel
from tests.workshop.export.helpers import FEATURE_DIM, WORD_VOCAB, random_images


@functools.cache
def varied_model() -> torch.nn.Module:
    """labert-test with wider random weights than BERT's N(0, 0.02), so captions differ between images."""
    torch.manual_seed(3)
    model = create_model("labert-test", vocab_size=WORD_VOCAB, feature_dim=FEATURE_DIM, dropout=0.0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.4)
    return model.eval()


@functools.cache
def exported_fp32():
    return export_onnx(varied_model(), name="labert-test", precisions=("fp32",))


def _cfg(level: int, **kw: object) -> DecodeCfg:
    return DecodeCfg(strategy="mask_predict", length_level=level, pad_id=0, bos_id=1, eos_id=2, **kw)


@pytest.mark.parametrize(("level", "rule"), [(1, "global"), (2, "original"), (4, "global")])
def test_torch_and_onnxruntime_give_identical_captions_at_fp32(level: int, rule: str) -> None:
    images = random_images(6, regions=7, seed=11)
    cfg = _cfg(level, update_rule=rule)
    expected = decode(TorchRefineModel(varied_model()), images, cfg)
    with create_onnxruntime_refine_model(**exported_fp32().runtime_models("fp32"), intra_op_threads=1) as refine_model:
        assert refine_model.length_levels == varied_model().cfg.levels  # read from the graph metadata
        assert refine_model.mask_id == WORD_VOCAB
        got = decode(refine_model, images, cfg)
    assert len({tuple(h[0].tokens) for h in expected}) > 1  # the images really get different captions
    high = varied_model().cfg.levels[level - 1][1]
    for want, have in zip(expected, got, strict=True):
        assert have[0].tokens == want[0].tokens and have[0].finished == want[0].finished
        assert have[0].score == pytest.approx(want[0].score, abs=1e-4)
        assert len(have[0].tokens) <= high


def test_onnxruntime_refine_rejects_missing_inputs() -> None:
    runtime = create_onnxruntime_refine_model(**exported_fp32().runtime_models("fp32"), intra_op_threads=1)
    with runtime as refine_model, pytest.raises(RuntimeInputError, match="feature_mask"):
        refine_model.encode({"features": torch.zeros(1, 3, FEATURE_DIM), "boxes": torch.zeros(1, 3, 4)})


def test_int8_graphs_run_mask_predict_close_to_fp32() -> None:
    """INT8 (QDQ, calibrated on refine feeds recorded during FP32 mask-predict at every level): one refine pass agrees
    with FP32 on most positions' argmax, and mask-predict on the INT8 graphs keeps captions within the level."""
    from edgecap.workshop.export.calibration.refine import quantize_labert_int8

    fp32_models = exported_fp32().runtime_models("fp32")
    calib = [random_images(4, regions=7, seed=s) for s in (21, 22)]
    int8 = quantize_labert_int8(fp32_models, calib, _cfg(1), preset="cpu-avx2", max_refine_feeds=32)
    assert int8.info["refine"]["role"] == "refine" and int8.info["refine"]["feeds"] == 32  # its own role: static QDQ
    images = random_images(6, regions=7, seed=11)
    tokens = torch.randint(0, WORD_VOCAB + 1, (6, 14), generator=torch.Generator().manual_seed(5)).numpy()
    levels = np.full(6, 2, dtype=np.int64)
    with (
        create_onnxruntime_refine_model(**fp32_models, intra_op_threads=1) as fp32,
        create_onnxruntime_refine_model(int8.models["encoder"], int8.models["refine"], intra_op_threads=1) as quant,
    ):
        want = fp32.refine(tokens, levels, fp32.encode(images)).argmax(-1)
        have = quant.refine(tokens, levels, quant.encode(images)).argmax(-1)
        assert (want == have).mean() >= 0.6  # measured 0.77 (a saturating INT8 graph gives ~0.1)
        for level in (1, 4):
            high = varied_model().cfg.levels[level - 1][1]
            assert all(len(h[0].tokens) <= high for h in decode(quant, images, _cfg(level)))
