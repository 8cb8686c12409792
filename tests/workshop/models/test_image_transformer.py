"""Image Transformer captioners: paper configuration and parameter count, cached steps == teacher forcing, masks,
relations on/off, the multi-scale grid, length control."""

from __future__ import annotations

import pytest
import torch

from edgecap.workshop.models import (
    CaptionModel,
    ImageTransformerCfg,
    LengthLevelError,
    ModelCfgError,
    cfg_from_dict,
    count_model_parameters,
    create_model,
    edge_settings,
    get_model_cfg,
    list_models,
    paper_settings,
)
from edgecap.workshop.models.backbone import grid_boxes
from edgecap.workshop.torch_runtime.prefix import PrefixRerunStepModel
from edgecap.workshop.torch_runtime.runtime import TorchStepModel

FEATURE_DIM = 12
VOCAB = 23
NAMES = list_models("image-transformer*")


def small(name: str = "image-transformer-test", **overrides) -> CaptionModel:
    torch.manual_seed(0)
    return create_model(name, VOCAB, feature_dim=FEATURE_DIM, **overrides).eval()


def visual(batch: int = 3, regions: int = 6, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, regions, FEATURE_DIM, generator=g)
    corner = torch.rand(batch, regions, 2, generator=g) * 0.6
    boxes = torch.cat((corner, corner + 0.1 + torch.rand(batch, regions, 2, generator=g) * 0.3), -1)
    boxes[:, 0] = torch.tensor([0.0, 0.0, 1.0, 1.0])  # a parent of every other region
    mask = torch.ones(batch, regions, dtype=torch.bool)
    mask[-1, 4:] = False
    return features, boxes, mask


def tokens(batch: int = 3, length: int = 7, seed: int = 2) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def closed_form(cfg: ImageTransformerCfg, vocab_size: int, feature_dim: int) -> int:
    """Parameters of the architecture in the module docstring, counted layer by layer."""
    d = cfg.d_model
    linear = d * d + d
    norm = 2 * d
    layer = norm + linear + 6 * linear + (2 * d) * (2 * d) + 2 * d  # LN, W_Q, 3 W_K + 3 W_V, AoA
    return (
        feature_dim * d + d
        + cfg.enc_layers * layer + norm
        + vocab_size * d  # word embedding
        + 4 * d * (2 * d) + 4 * d * d + 8 * d  # LSTMCell(2d -> d)
        + norm + linear  # query
        + cfg.branches * (d * 2 * d + 2 * d)  # implicit branches' K/V (Eq. 9)
        + (2 * d) * (2 * d) + 2 * d  # GLU context (Eq. 10)
        + d * vocab_size + vocab_size  # Eq. 11
        + ((len(cfg.length_levels) + 1) * d if cfg.length_levels else 0)
    )  # fmt: skip


# -- configurations --------------------------------------------------------------------------------------------------
def test_paper_configuration_and_count() -> None:
    cfg = get_model_cfg("image-transformer")
    assert (cfg.d_model, cfg.heads, cfg.enc_layers, cfg.branches, cfg.overlap_eps) == (1024, 8, 3, 3, 0.9)
    assert paper_settings("image-transformer") == {"vocab_size": 10370, "feature_dim": 2048}
    total = count_model_parameters("image-transformer", **paper_settings("image-transformer"))
    assert total == 82_121_858  # the released code's ≈ 82 M
    vocab_layers = 2 * 10370 * 1024 + 10370
    assert total - vocab_layers == 60_873_728  # ≈ 61 M without the two vocabulary-sized layers


@pytest.mark.parametrize("name", NAMES)
def test_parameter_counts_follow_the_closed_form(name: str) -> None:
    cfg = get_model_cfg(name)
    settings = paper_settings(name)
    assert count_model_parameters(name, **settings) == closed_form(cfg, **settings)


def test_edge_variants_are_comparable_to_the_other_families() -> None:
    def edge(name: str) -> int:
        return count_model_parameters(name, **edge_settings(name))  # the default grid, a 124-word vocabulary

    assert edge("image-transformer-xsmall") == 2_610_172
    assert edge("acort-xsmall") < edge("image-transformer-xsmall") < edge("expansionnet-v2-xsmall")
    assert abs(edge("image-transformer-small") - edge("expansionnet-v2-small")) / edge("expansionnet-v2-small") < 0.15


def test_cfg_round_trip_and_overrides() -> None:
    cfg = get_model_cfg("image-transformer-test-len")
    assert cfg_from_dict(cfg.to_dict()) == cfg
    assert create_model("image-transformer-test", 30, grid_scales="4,2,1").cfg.grid_scales == (4, 2, 1)
    assert create_model("image-transformer-test", 30, grid_scales="none").cfg.grid_scales == ()
    with pytest.raises(ModelCfgError, match="grid_scales"):
        ImageTransformerCfg(grid_scales=(3, 0))
    with pytest.raises(ModelCfgError, match="divisible"):
        ImageTransformerCfg(d_model=30, heads=8)
    with pytest.raises(ModelCfgError, match="overlap_eps"):
        ImageTransformerCfg(overlap_eps=0.3)
    with pytest.raises(ModelCfgError, match="relations"):
        ImageTransformerCfg(relations="yes")


# -- cached decoding == teacher forcing ------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [{}, {"relations": False, "grid_scales": ()}])
@torch.no_grad()
def test_step_logits_equal_the_full_forward(overrides: dict) -> None:
    model = small(**overrides)
    features, boxes, mask = visual()
    toks = tokens()
    full = model(features, boxes, mask, toks)
    state = model.encode(features, boxes, mask)
    assert state["branch_k"].shape == (3, 2, 2, 6, 16)  # (B, M, H, N, d_k): projected once, in start
    for t in range(toks.shape[1]):
        logp, new_state = model.step(toks[:, t], state)
        torch.testing.assert_close(logp, full[:, t], atol=1e-6, rtol=0)
        for name in ("memory_bias", "branch_k", "branch_v", "memory_mean"):
            assert new_state[name] is state[name]  # per-image entries are carried, never recomputed
        state = new_state


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


@torch.no_grad()
def test_padded_regions_and_boxes_are_ignored() -> None:
    model = small()
    features, boxes, mask = visual()
    toks = tokens()
    base = model(features, boxes, mask, toks)
    noisy, moved = features.clone(), boxes.clone()
    noisy[-1, 4:] = 100.0
    moved[-1, 4:] = torch.tensor([0.0, 0.0, 1.0, 1.0])
    torch.testing.assert_close(model(noisy, moved, mask, toks), base)


@torch.no_grad()
def test_relations_change_the_encoding() -> None:
    """Eq. 6 masks: the relation-aware and the ablated ("w/o spatial relations") encoders differ on nested boxes;
    the multi-scale cells change the memory of a grid but not its length, and leave regions alone."""
    features, boxes, mask = visual()
    with_graph = small().encode_memory(features, boxes, mask)
    without = small(relations=False).encode_memory(features, boxes, mask)
    single = small(grid_scales=()).encode_memory(features, boxes, mask)
    assert with_graph.shape == without.shape == single.shape == (3, 6, 32)
    assert not torch.allclose(with_graph, without, atol=1e-3)
    torch.testing.assert_close(with_graph, single, atol=1e-6, rtol=0)  # regions: the paper's graph, no coarse cells
    cells = grid_boxes(3, 3).expand(3, 9, 4)
    grid_features = torch.randn(3, 9, FEATURE_DIM, generator=torch.Generator().manual_seed(3))
    multi = small().encode_memory(grid_features, cells, None)
    assert multi.shape == (3, 9, 32)
    assert not torch.allclose(multi, small(grid_scales=()).encode_memory(grid_features, cells, None), atol=1e-3)


def test_gradients_reach_every_parameter() -> None:
    model = small(name="image-transformer-test-len").train()
    features, boxes, mask = visual()
    model(features, boxes, mask, tokens(), torch.tensor([1, 2, 4])).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing
    assert model.level_embed.weight.grad[[1, 2, 4]].abs().sum() > 0


# -- length control (LaBERT §3.1, Eq. 2) -----------------------------------------------------------------------------
def test_len_variants_add_only_the_level_embedding() -> None:
    len_names = [n for n in NAMES if n.endswith("-len")]
    assert len_names == [
        "image-transformer-len",
        "image-transformer-small-len",
        "image-transformer-test-len",
        "image-transformer-xsmall-len",
    ]
    for name in len_names:
        cfg, base = get_model_cfg(name), get_model_cfg(name.removesuffix("-len"))
        assert cfg.replace(length_levels=None) == base
        extra = count_model_parameters(name, 124, 1280) - count_model_parameters(name.removesuffix("-len"), 124, 1280)
        assert extra == 5 * cfg.d_model


@torch.no_grad()
def test_length_level_steps_equal_teacher_forcing_and_matter() -> None:
    model = small("image-transformer-test-len")
    features, boxes, mask = visual()
    toks, levels = tokens(), torch.tensor([1, 3, 4])
    full = model(features, boxes, mask, toks, levels)
    state = model.encode(features, boxes, mask, levels)
    for t in range(toks.shape[1]):
        logp, state = model.step(toks[:, t], state)
        torch.testing.assert_close(logp, full[:, t], atol=1e-6, rtol=0)
    other = model(features, boxes, mask, toks, torch.tensor([2, 2, 2]))
    assert not torch.allclose(full, other)
    with pytest.raises(LengthLevelError):
        model.encode(features, boxes, mask)
    with pytest.raises(LengthLevelError):
        small().encode(features, boxes, mask, levels)
