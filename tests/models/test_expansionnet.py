"""ExpansionNet captioners: paper configurations, parameter counts, cached steps == teacher forcing, masks, state."""

from __future__ import annotations

import pytest
import torch

from edgecap.models import (
    CaptionModel,
    ExpansionNetCfg,
    ModelCfgError,
    cfg_from_dict,
    count_model_parameters,
    create_model,
    get_model_cfg,
    list_models,
    paper_settings,
)
from edgecap.runtimes.prefix import PrefixRerunStepModel
from edgecap.runtimes.torch import TorchStepModel

FEATURE_DIM = 12
VOCAB = 23
NAMES = list_models("expansionnet*")


def small(name: str = "expansionnet-test", **overrides) -> CaptionModel:
    torch.manual_seed(0)
    return create_model(name, VOCAB, feature_dim=FEATURE_DIM, **overrides).eval()


def visual(batch: int = 3, regions: int = 6, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, regions, FEATURE_DIM, generator=g)
    boxes = torch.rand(batch, regions, 4, generator=g)
    mask = torch.ones(batch, regions, dtype=torch.bool)
    mask[-1, 4:] = False
    return features, boxes, mask


def tokens(batch: int = 3, length: int = 7, seed: int = 2) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def closed_form(cfg: ExpansionNetCfg, vocab_size: int, feature_dim: int) -> int:
    """Parameters of the architecture in the module docstring, counted layer by layer."""
    d, f = cfg.d_model, cfg.d_ff
    linear = d * d + d
    ffn = d * f + f + f * d + d
    norm = 2 * d
    static = 2 * sum(cfg.enc_groups) * d + 4 * linear  # E_Q, E_B; K, V1, V2, S
    dynamic = 2 * cfg.dec_slots * d + 5 * linear  # E_Q, E_B; C, K, V1, V2, S

    def reduce(n: int) -> int:
        return n * d * d + d if cfg.layer_reduce else 0

    return (
        feature_dim * d + d
        + cfg.enc_layers * (static + ffn + 2 * norm)
        + cfg.dec_layers * (dynamic + 4 * linear + ffn + 3 * norm)
        + reduce(cfg.enc_layers) + reduce(cfg.dec_layers) + 2 * norm
        + vocab_size * d + cfg.max_len * d  # token and position tables
        + d * vocab_size + vocab_size
    )  # fmt: skip


# -- configurations --------------------------------------------------------------------------------------------------
def test_configs_follow_the_papers() -> None:
    assert set(NAMES) >= {"expansionnet-v2", "expansionnet-v2-small", "expansionnet-v2-xsmall", "expansionnet-v1"}
    v2 = get_model_cfg("expansionnet-v2")
    assert (v2.d_model, v2.d_ff, v2.heads, v2.enc_layers, v2.dec_layers) == (512, 2048, 8, 3, 3)  # v2 §4.2
    assert v2.enc_groups == (32, 64, 128, 256, 512) and v2.dec_slots == 16 and v2.layer_reduce
    v1 = get_model_cfg("expansionnet-v1")  # ExpansionNet_{64,16} (v1 §4.2)
    assert v1.enc_groups == (64,) and v1.dec_slots == 16 and (v1.d_model, v1.d_ff) == (512, 2048)
    assert (
        paper_settings("expansionnet-v1")["feature_dim"] == 2048
        and paper_settings("expansionnet-v2")["feature_dim"] == 1536
    )


@pytest.mark.parametrize("name", NAMES)
def test_parameter_counts_follow_the_closed_form(name: str) -> None:
    cfg = get_model_cfg(name)
    settings = paper_settings(name)
    assert count_model_parameters(name, **settings) == closed_form(cfg, **settings)


def test_v2_head_matches_the_reference_arithmetic() -> None:
    """About 38.6 M for the captioning head at V = 10,000 on Swin-L features (reference notes §1.1)."""
    count = count_model_parameters("expansionnet-v2", vocab_size=10000, feature_dim=1536)
    assert abs(count - 38.6e6) / 38.6e6 < 0.01


def test_edge_variants_are_small() -> None:
    xsmall = count_model_parameters("expansionnet-v2-xsmall", vocab_size=124, feature_dim=1280)
    small_ = count_model_parameters("expansionnet-v2-small", vocab_size=124, feature_dim=1280)
    assert xsmall < 3.0e6 < small_ < 10e6


def test_cfg_round_trip_and_overrides() -> None:
    cfg = get_model_cfg("expansionnet-v2")
    assert cfg_from_dict(cfg.to_dict()) == cfg
    assert create_model("expansionnet-test", 30, enc_groups="4,8").cfg.enc_groups == (4, 8)  # CLI spelling
    with pytest.raises(ModelCfgError, match="enc_groups"):
        ExpansionNetCfg(enc_groups=(4, 0))
    with pytest.raises(ModelCfgError, match="dec_slots"):
        create_model("expansionnet-test", 30, dec_slots=0)
    with pytest.raises(ModelCfgError, match="divisible"):
        ExpansionNetCfg(d_model=30, heads=8)
    with pytest.raises(ModelCfgError, match="unknown"):
        cfg_from_dict({**cfg.to_dict(), "share_att": "kv"})


# -- cached decoding == teacher forcing ------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [{}, {"layer_reduce": False, "enc_groups": (4,)}])
@torch.no_grad()
def test_step_logits_equal_the_full_forward(overrides: dict) -> None:
    model = small(**overrides)
    features, boxes, mask = visual()
    toks = tokens()
    full = model(features, boxes, mask, toks)
    state = model.encode(features, boxes, mask)
    for t in range(toks.shape[1]):
        logp, new_state = model.step(toks[:, t], state)
        torch.testing.assert_close(logp, full[:, t], atol=1e-5, rtol=0)
        for name in ("exp_k_0", "exp_c_1"):  # past positions are reused, never recomputed
            torch.testing.assert_close(new_state[name][:, :t], state[name])
        for name in ("exp_r1_0", "exp_r2_1"):  # so are past slots' coefficients; their new column is zero
            torch.testing.assert_close(new_state[name][:, :t, :, :t], state[name])
            assert not new_state[name][:, :t, :, t].any()
        state = new_state
    assert state["exp_r1_1"].shape == (3, 7, 2, 7)  # (B, T, N_E, T) per layer


@torch.no_grad()
def test_cached_beam_equals_the_rerun_prefix_baseline() -> None:
    from edgecap.decoding import DecodeCfg, beam_search

    model = small()
    features, boxes, mask = visual(batch=2)
    inputs = {"features": features, "boxes": boxes, "feature_mask": mask}
    cfg = DecodeCfg(beam_size=3, n_best=3, max_len=8, pad_id=0, bos_id=1, eos_id=2)
    cached = beam_search(TorchStepModel(model), inputs, cfg)
    rerun = beam_search(PrefixRerunStepModel(model), inputs, cfg)
    assert [[h.tokens for h in r] for r in cached] == [[h.tokens for h in r] for r in rerun]
    for a, b in zip(cached, rerun, strict=True):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


@torch.no_grad()
def test_padded_regions_and_boxes_are_ignored() -> None:
    model = small()
    features, boxes, mask = visual()
    toks = tokens()
    base = model(features, boxes, mask, toks)
    noisy = features.clone()
    noisy[-1, 4:] = 100.0
    torch.testing.assert_close(model(noisy, torch.rand_like(boxes), mask, toks), base)


def test_gradients_reach_every_parameter() -> None:
    model = small().train()
    features, boxes, mask = visual()
    toks = tokens()
    model(features, boxes, mask, toks).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


def test_decoding_past_max_len_fails_loudly() -> None:
    model = small(max_len=3)
    features, boxes, mask = visual()
    state = model.encode(features, boxes, mask)
    for _ in range(3):
        _, state = model.step(torch.ones(3, dtype=torch.long), state)
    with pytest.raises(ValueError, match="max_len"):
        model.step(torch.ones(3, dtype=torch.long), state)
