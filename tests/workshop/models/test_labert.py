"""LaBERT model (§3.2): registry entries, the embeddings' contract, bidirectionality, length-level checks."""

from __future__ import annotations

import json

import pytest
import torch

from edgecap.runtime.length import LENGTH_PLANS, check_level, level_of, parse_levels
from edgecap.workshop.models import (
    LaBertCfg,
    LengthLevelError,
    ModelCfgError,
    cfg_from_dict,
    count_model_parameters,
    create_model,
    get_model_cfg,
)


def closed_form(cfg: LaBertCfg, vocab: int, feat: int) -> int:
    d, f, k = cfg.d_model, cfg.d_ff, len(cfg.levels)
    embeddings = (vocab + 1) * d + cfg.max_len * d + (k + 2) * d
    visual = feat * d + d + 5 * 2 + 5 * d + d + 2 * d  # W_e, LN(loc), W_p, embedding LN
    layer = 4 * (d * d + d) + 2 * 2 * d + d * f + f + f * d + d
    head = d * d + d + 2 * d + d * vocab + vocab
    return embeddings + visual + cfg.layers * layer + head


@pytest.mark.parametrize("name", ["labert-base", "labert-base-5level", "labert-small", "labert-xsmall", "labert-test"])
def test_parameter_counts_follow_the_formula_and_json_round_trip(name: str) -> None:
    cfg = get_model_cfg(name)
    assert count_model_parameters(name, vocab_size=124, feature_dim=1280) == closed_form(cfg, 124, 1280)
    assert cfg_from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_paper_size_is_bert_base_shape_with_the_paper_defaults() -> None:
    cfg = get_model_cfg("labert-base")
    assert (cfg.layers, cfg.d_model, cfg.heads, cfg.d_ff) == (12, 768, 12, 3072)
    assert cfg.levels == LENGTH_PLANS["4level"] == ((1, 9), (10, 14), (15, 19), (20, 25))
    assert cfg.refine_steps == (10, 15, 20, 25) and cfg.eos_decay == (1.0, 0.88, 0.95, 1.0)
    assert get_model_cfg("labert-base-5level").levels == ((1, 9), (10, 13), (14, 17), (18, 21), (22, 25))
    assert cfg.replace(levels="5level").refine_steps == (9, 13, 17, 21, 25)  # defaults follow the plan


def test_length_levels_helpers() -> None:
    levels = parse_levels("4level")
    assert [level_of(levels, n) for n in (0, 1, 9, 10, 14, 15, 20, 25, 40)] == [1, 1, 1, 2, 2, 3, 4, 4, 4]
    assert parse_levels([[1, 5], [6, 8]]) == ((1, 5), (6, 8))
    with pytest.raises(LengthLevelError, match="contiguous"):
        parse_levels([[1, 5], [7, 8]])
    with pytest.raises(LengthLevelError, match="1..4"):
        check_level(levels, 5)
    with pytest.raises(ModelCfgError, match="eos_decay"):
        LaBertCfg(eos_decay=(1.0, 2.0, 1.0, 1.0))
    with pytest.raises(ModelCfgError, match="word"):
        LaBertCfg(vocab_kind="radix")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("labert-test", vocab_size=20, feature_dim=16, dropout=0.0).eval()


@torch.no_grad()
def test_refine_is_bidirectional_and_uses_the_level_and_the_image() -> None:
    model = _model()
    g = torch.Generator().manual_seed(1)
    feats, boxes = torch.randn(2, 5, 16, generator=g), torch.rand(2, 5, 4, generator=g)
    state = model.encode(feats, boxes, None)
    tokens = torch.full((2, 9), model.mask_id)
    level = torch.tensor([1, 1])
    base = model.refine(tokens, level, state)
    assert base.shape == (2, 9, 20)
    torch.testing.assert_close(base.exp().sum(-1), torch.ones(2, 9))
    later = tokens.clone()
    later[:, -1] = 5
    assert not torch.allclose(model.refine(later, level, state)[:, 0], base[:, 0])  # no causal mask
    assert not torch.allclose(model.refine(tokens, torch.tensor([2, 2]), state), base)  # Eq. 2
    other = model.encode(feats.flip(0), boxes, None)
    assert not torch.allclose(model.refine(tokens, level, other), base)  # Eq. 3
    # padded regions are ignored: appending a masked-out region changes nothing
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[:, -1] = False
    padded = model.encode(torch.cat((feats, feats[:, :1] * 9), 1), torch.cat((boxes, boxes[:, :1]), 1), mask)
    torch.testing.assert_close(model.refine(tokens, level, padded), base, atol=1e-5, rtol=0)


@torch.no_grad()
def test_bad_inputs_raise_clear_errors() -> None:
    model = _model()
    state = model.encode(torch.randn(1, 3, 16), torch.rand(1, 3, 4), None)
    with pytest.raises(LengthLevelError, match="length_level"):
        model.refine(torch.zeros(1, 4, dtype=torch.long), torch.tensor([5]), state)
    with pytest.raises(ValueError, match="max_len"):
        model.refine(torch.zeros(1, 26, dtype=torch.long), torch.tensor([1]), state)
    with pytest.raises(ValueError, match="features"):
        model.encode(torch.randn(1, 3, 8), torch.rand(1, 3, 4), None)
