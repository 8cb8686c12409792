"""ExpansionNet captioners: paper configurations, parameter counts, cached steps == teacher forcing, masks, state."""

from __future__ import annotations

import pytest
import torch

from edgecap.workshop.models import (
    CaptionModel,
    ExpansionNetCfg,
    LengthLevelError,
    ModelCfgError,
    ModelInputError,
    cfg_from_dict,
    count_model_parameters,
    create_model,
    get_model_cfg,
    list_models,
    paper_settings,
)
from edgecap.workshop.torch_runtime.prefix import PrefixRerunStepModel
from edgecap.workshop.torch_runtime.runtime import TorchStepModel

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
        + ((len(cfg.length_levels) + 1) * d if cfg.length_levels else 0)  # level embedding (Eq. 2), row 0 unused
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
    """About 38.6 M for the captioning head at V = 10,000 on Swin-L features (the official code's layer sizes)."""
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
    from edgecap.runtime.decoding import DecodeCfg, beam_search

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


# -- length control (LaBERT §3.1, Eq. 2) -----------------------------------------------------------------------------
LEN_NAMES = [n for n in NAMES if n.endswith("-len")]
LEVELS = torch.tensor([1, 3, 4])  # one level per row of visual()


def test_len_variants_add_only_the_level_embedding() -> None:
    assert LEN_NAMES == [
        "expansionnet-test-len",
        "expansionnet-v2-len",
        "expansionnet-v2-small-len",
        "expansionnet-v2-xsmall-len",
    ]
    for name in LEN_NAMES:
        cfg, base = get_model_cfg(name), get_model_cfg(name.removesuffix("-len"))
        assert cfg.length_levels == ((1, 9), (10, 14), (15, 19), (20, 25)) and base.length_levels is None
        assert cfg.replace(length_levels=None) == base
        extra = count_model_parameters(name, 124, 1280) - count_model_parameters(name.removesuffix("-len"), 124, 1280)
        assert extra == 5 * cfg.d_model  # 4 levels + the unused row 0


def test_cfg_round_trip_with_length_levels() -> None:
    cfg = get_model_cfg("expansionnet-v2-xsmall-len")
    data = cfg.to_dict()
    assert data["length_levels"] == [[1, 9], [10, 14], [15, 19], [20, 25]]
    assert cfg_from_dict(data) == cfg == ExpansionNetCfg.from_dict(data)
    assert get_model_cfg("expansionnet-v2").to_dict()["length_levels"] is None
    assert cfg.summary()["length_levels"] == 4 and get_model_cfg("expansionnet-v2").summary()["length_levels"] is None
    # CLI spellings (--set length_levels=...), as ObjectRelationCfg
    assert ExpansionNetCfg(length_levels="5level").length_levels[-1] == (22, 25)
    assert ExpansionNetCfg(length_levels=[[1, 5], [6, 12]]).length_levels == ((1, 5), (6, 12))
    assert cfg.replace(length_levels="none").length_levels is None
    assert create_model("expansionnet-test", 30, length_levels="4level").length_levels == cfg.length_levels
    with pytest.raises(ModelCfgError, match="ExpansionNetCfg.length_levels.*unknown length plan"):
        ExpansionNetCfg(length_levels="3level")
    with pytest.raises(ModelCfgError, match="ExpansionNetCfg.length_levels.*contiguous"):
        cfg_from_dict({**data, "length_levels": [[1, 5], [7, 9]]})


@torch.no_grad()
def test_step_logits_equal_the_full_forward_with_per_row_levels() -> None:
    model = small("expansionnet-test-len")
    assert model.state_names[-1] == "level_embed"
    features, boxes, mask = visual()
    toks = tokens()
    full = model(features, boxes, mask, toks, LEVELS)
    state = model.encode(features, boxes, mask, LEVELS)
    assert state["level_embed"].shape == (3, 1, 32)
    torch.testing.assert_close(state["level_embed"][:, 0], model.level_embed.weight[LEVELS])
    for t in range(toks.shape[1]):
        logp, new_state = model.step(toks[:, t], state)
        torch.testing.assert_close(logp, full[:, t], atol=1e-5, rtol=0)
        assert new_state["level_embed"] is state["level_embed"]  # read, never written
        state = new_state
    # each row only sees its own level: a row decoded alone at that level gives the same log-probs
    alone = model(features[1:2], boxes[1:2], mask[1:2], toks[1:2], LEVELS[1:2])
    torch.testing.assert_close(alone, full[1:2], atol=1e-5, rtol=0)


@torch.no_grad()
def test_levels_change_the_log_probs() -> None:
    model = small("expansionnet-test-len")
    features, boxes, mask = visual()
    toks = tokens()
    by_level = [model(features, boxes, mask, toks, torch.full((3,), k)) for k in range(1, 5)]
    for i in range(4):
        for j in range(i + 1, 4):
            assert (by_level[i] - by_level[j]).abs().max() > 1e-3, (i + 1, j + 1)


@torch.no_grad()
def test_length_level_is_refused_without_levels_and_required_with_them() -> None:
    features, boxes, mask = visual()
    plain, aware = small(), small("expansionnet-test-len")
    assert plain.length_levels is None and "level_embed" not in plain.state_names and plain.level_embed is None
    with pytest.raises(LengthLevelError, match="no length control"):
        plain.encode(features, boxes, mask, LEVELS)
    with pytest.raises(LengthLevelError, match="no length control"):
        plain(features, boxes, mask, tokens(), LEVELS)
    with pytest.raises(LengthLevelError, match=r"pass length_level in 1\.\.4"):
        aware.encode(features, boxes, mask)
    with pytest.raises(LengthLevelError, match=r"pass length_level in 1\.\.4"):
        aware(features, boxes, mask, tokens())
    with pytest.raises(LengthLevelError, match=r"1\.\.4"):
        aware.encode(features, boxes, mask, torch.tensor([1, 5, 2]))
    with pytest.raises(LengthLevelError, match=r"1\.\.4"):
        aware.encode(features, boxes, mask, torch.tensor([0, 1, 2]))
    with pytest.raises(ModelInputError, match="batch"):
        aware.encode(features, boxes, mask, torch.tensor([1, 2]))
    with pytest.raises(ModelInputError, match="state does not match"):  # a state without its level embedding
        state = aware.encode(features, boxes, mask, LEVELS)
        aware.step(torch.ones(3, dtype=torch.long), {k: v for k, v in state.items() if k != "level_embed"})


def test_gradients_reach_the_level_embedding() -> None:
    model = small("expansionnet-test-len").train()
    features, boxes, mask = visual()
    model(features, boxes, mask, tokens(), LEVELS).mean().backward()
    grad = model.level_embed.weight.grad
    assert grad[LEVELS].abs().sum(dim=1).gt(0).all() and not grad[0].any() and not grad[2].any()  # rows 1, 3, 4 only
