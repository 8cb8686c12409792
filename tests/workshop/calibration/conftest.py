"""Tiny registered captioners exported once per test session (a dynamo export costs seconds per graph), and
calibration inputs for them: random region features standing in for a folder of images."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from edgecap.runtime.decoding import DecodeCfg
from edgecap.runtime.vocab import RadixVocab, WordVocab

FEATURE_DIM = 16
RADIX_BASE = 16


@dataclasses.dataclass
class Exported:
    name: str
    model: torch.nn.Module
    result: Any  # edgecap.workshop.export.ExportResult
    vocab: Any

    @property
    def fp32(self) -> dict[str, Any]:
        return self.result.runtime_models("fp32")

    @property
    def spec(self) -> Any:
        return self.result.spec

    def cfg(self, strategy: str = "greedy", max_words: int = 4, **overrides: Any) -> DecodeCfg:
        max_len = max_words * self.vocab.tokens_per_word + 1
        return DecodeCfg.for_vocab(self.vocab, strategy=strategy, max_len=max_len, **overrides)


def _export(name: str, vocab: Any, **kw: Any) -> Exported:
    pytest.importorskip("onnxruntime")
    from edgecap.workshop.export import export_onnx
    from edgecap.workshop.models import create_model

    torch.manual_seed(0)
    model = create_model(name, vocab_size=vocab.size, feature_dim=FEATURE_DIM, **kw).eval()
    with torch.no_grad():  # a sharper output layer, like a trained model's: top-1 margins above int8 noise
        model.output_proj.weight.mul_(4.0)
    return Exported(name, model, export_onnx(model, None, precisions=["fp32"], parity=False), vocab)


@pytest.fixture(scope="session")
def acort() -> Exported:
    """acort-test: radix vocabulary (base 16, 2 digits per word), Share-KV state (memory_bias, cross_k, and one
    self_k{i} per decoder position)."""
    vocab = RadixVocab([f"w{i}" for i in range(40)], base=RADIX_BASE)
    return _export("acort-test", vocab, radix_base=RADIX_BASE)


@pytest.fixture(scope="session")
def ort_word() -> Exported:
    """ort-test: word vocabulary, separate cross/self values (five state tensors)."""
    vocab = WordVocab([f"w{i}" for i in range(26)])
    return _export("ort-test", vocab)


def _region_feeds(count: int, batch: int = 4, regions: int = 6, seed: int = 0) -> list[dict[str, np.ndarray]]:
    from edgecap.workshop.export.specs.captioning import random_boxes, random_mask

    g = torch.Generator().manual_seed(seed)
    return [
        {
            "features": torch.randn(batch, regions, FEATURE_DIM, generator=g).numpy(),
            "boxes": random_boxes(batch, regions, g).numpy(),
            "feature_mask": random_mask(batch, regions, g).numpy(),
        }
        for _ in range(count)
    ]


@pytest.fixture(scope="session")
def region_feeds() -> Any:
    """``region_feeds(count, batch=4, regions=6, seed=0)``: encoder feeds of random region features, valid boxes and
    masks with some padding."""
    return _region_feeds
