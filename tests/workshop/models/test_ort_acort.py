"""ORT / ACORT captioners: cached steps equal teacher forcing for every registered config, masking, sharing, state."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgecap.workshop.models import (
    CaptionModel,
    ModelInputError,
    create_model,
    get_model_cfg,
    list_models,
    model_family,
)
from edgecap.workshop.models.layers.attention import MultiHeadAttention, mask_to_bias

FEATURE_DIM = 12


def small_model(name: str, **overrides) -> CaptionModel:
    """The registered architecture (width, depth, sharing) with a tiny vocabulary and feature dim, in eval mode."""
    if get_model_cfg(name).vocab_kind == "radix":
        overrides = {"radix_base": 16, **overrides}
        vocab = overrides["radix_base"] + 3
    else:
        vocab = 23
    torch.manual_seed(0)
    return create_model(name, vocab, feature_dim=FEATURE_DIM, **overrides).eval()


def visual(batch: int = 2, regions: int = 5, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random features, boxes and a mask where the last item keeps only 3 regions."""
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, regions, FEATURE_DIM, generator=gen)
    xy = torch.rand(batch, regions, 2, generator=gen) * 0.6
    wh = torch.rand(batch, regions, 2, generator=gen) * 0.35 + 0.05
    mask = torch.ones(batch, regions, dtype=torch.bool)
    mask[-1, 3:] = False
    return features, torch.cat([xy, xy + wh], -1), mask


def tokens_for(model: CaptionModel, batch: int = 2, length: int = 6, seed: int = 2) -> torch.Tensor:
    return torch.randint(1, model.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


def levels_for(model: CaptionModel, batch: int) -> torch.Tensor | None:
    """1-based length levels cycling over the plan for a length-controllable model, else None."""
    if not model.length_levels:
        return None
    return torch.arange(batch) % len(model.length_levels) + 1


def run_steps(model: CaptionModel, state: dict, tokens: torch.Tensor) -> torch.Tensor:
    out = []
    for t in range(tokens.shape[1]):
        logp, state = model.step(tokens[:, t], state)
        out.append(logp)
    return torch.stack(out, 1)


# -- the core invariant: cached decoding == teacher forcing ---------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in list_models() if model_family(n) == "ort"])
@torch.no_grad()
def test_step_matches_teacher_forcing(name):
    model = small_model(name)
    features, boxes, mask = visual()
    tokens = tokens_for(model)
    levels = levels_for(model, 2)
    full = model(features, boxes, mask, tokens, levels)
    assert full.shape == (2, 6, model.vocab_size)
    stepped = run_steps(model, model.encode(features, boxes, mask, levels), tokens)
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", [n for n in list_models("*-test*") if model_family(n) == "ort"])
@torch.no_grad()
def test_step_matches_teacher_forcing_without_mask_and_in_reference_mode(name):
    features, boxes, _ = visual(batch=3, regions=4)
    for overrides in ({}, {"layer_norm": "annotated", "box_wh_offset": 1.0}):
        model = small_model(name, **overrides)
        tokens = tokens_for(model, batch=3, length=5)
        levels = levels_for(model, 3)
        full = model(features, boxes, None, tokens, levels)
        stepped = run_steps(model, model.encode(features, boxes, None, levels), tokens)
        torch.testing.assert_close(stepped, full, atol=1e-5, rtol=0)


@torch.no_grad()
def test_a_module_keyed_cache_would_fail_this_check():
    """The ACORT reference keeps one cache per module; with (0x2) sharing the module's cache grows twice per step
    and mixes depths (jiahuei/sparse-image-captioning). Emulate it to show the comparison above catches the bug."""
    model = small_model("acort-test")
    assert model.decoder.layers.layer_map == (0, 0)
    features, boxes, mask = visual()
    tokens = tokens_for(model)
    memory = model.encode_memory(features, boxes, mask)
    full = model.decode_full(memory, mask, tokens)
    cross_k, _ = model.decoder.project_memory(memory)
    bias = mask_to_bias(mask, memory)
    cache: dict[int, torch.Tensor] = {}
    buggy = []
    for t in range(tokens.shape[1]):
        x = model.embed(tokens[:, t : t + 1], start=t)
        for layer in model.decoder.layers:
            past = cache.get(id(layer), model.decoder.empty_cache(memory)[:, 0])
            x, cache[id(layer)], _ = layer.step(x, past, None, cross_k[:, 0], cross_k[:, 0], bias)
        buggy.append(torch.log_softmax(model.output_proj(model.decoder.norm(x))[:, 0], -1))
    assert (torch.stack(buggy, 1) - full).abs().max() > 1e-3


@torch.no_grad()
def test_prefix_rerun_matches_step():
    """decode_full on a growing prefix is the reference implementations' uncached decoder."""
    model = small_model("acort-test")
    features, boxes, mask = visual()
    tokens = tokens_for(model, length=4)
    memory = model.encode_memory(features, boxes, mask)
    state = model.start(memory, mask)
    for t in range(tokens.shape[1]):
        logp, state = model.step(tokens[:, t], state)
        torch.testing.assert_close(model.decode_full(memory, mask, tokens[:, : t + 1])[:, -1], logp, atol=1e-5, rtol=0)


@torch.no_grad()
def test_log_probs_are_normalised():
    model = small_model("ort-test")
    features, boxes, mask = visual()
    logp = model(features, boxes, mask, tokens_for(model))
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(2, 6))


@pytest.mark.parametrize("name", ["ort-test", "acort-test"])
@torch.no_grad()
def test_float16_model_is_finite_and_consistent(name):
    """fp16 deployment: finite −1e4 masks, fp32 geometry embedding, and the cache path still equals teacher forcing."""
    model = small_model(name)
    features, boxes, mask = visual()
    tokens = tokens_for(model)
    reference = model(features, boxes, mask, tokens)
    half = model.half()
    full = half(features.half(), boxes.half(), mask, tokens)
    assert full.dtype == torch.float16 and torch.isfinite(full).all()
    stepped = run_steps(half, half.encode(features.half(), boxes.half(), mask), tokens)
    torch.testing.assert_close(stepped, full, atol=1e-2, rtol=0)
    assert (full.float() - reference).abs().max() < 0.25


# -- masking and geometry --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ort-test", "acort-test", "acort-test-qk"])
@torch.no_grad()
def test_padded_regions_are_ignored(name):
    model = small_model(name)
    features, boxes, mask = visual()
    tokens = tokens_for(model)
    noisy_f, noisy_b = features.clone(), boxes.clone()
    noisy_f[~mask] = 100.0
    noisy_b[~mask] = torch.tensor([0.9, 0.9, 0.0, 0.0])  # even an inverted box
    torch.testing.assert_close(model(noisy_f, noisy_b, mask, tokens), model(features, boxes, mask, tokens))
    # the padded item equals the same item run alone without padding
    alone = model(features[-1:, :3], boxes[-1:, :3], None, tokens[-1:])
    torch.testing.assert_close(model(features, boxes, mask, tokens)[-1:], alone, atol=1e-5, rtol=0)


@torch.no_grad()
def test_regions_are_an_unordered_set():
    model = small_model("acort-test-qk")
    features, boxes, mask = visual()
    perm = torch.tensor([3, 0, 4, 1, 2])
    memory = model.encode_memory(features, boxes, mask)
    torch.testing.assert_close(model.encode_memory(features[:, perm], boxes[:, perm], mask[:, perm]), memory[:, perm])
    tokens = tokens_for(model)
    torch.testing.assert_close(
        model(features[:, perm], boxes[:, perm], mask[:, perm], tokens), model(features, boxes, mask, tokens)
    )


@torch.no_grad()
def test_boxes_matter_only_with_geometry():
    features, boxes, mask = visual()
    moved = boxes.clone()
    moved[..., 2:] = (moved[..., 2:] + 0.2).clamp(max=1.0)
    with_geo = small_model("acort-test")
    assert not torch.allclose(
        with_geo.encode_memory(features, boxes, mask), with_geo.encode_memory(features, moved, mask)
    )
    without = small_model("acort-test", geometry=False)
    assert all(layer.geometric_bias is None for layer in without.encoder.layers)
    torch.testing.assert_close(
        without.encode_memory(features, boxes, mask), without.encode_memory(features, moved, mask)
    )


# -- sharing ---------------------------------------------------------------------------------------------------------


def _attention_modules(model: nn.Module) -> list[MultiHeadAttention]:
    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


@pytest.mark.parametrize(("name", "linears"), [("ort-test", 4), ("acort-test", 3), ("acort-test-qk", 3)])
def test_attention_sharing_uses_three_projections(name, linears):
    model = small_model(name)
    attentions = _attention_modules(model)
    cfg = model.cfg
    unique = (max(cfg.enc_layer_map) + 1) + 2 * (max(cfg.dec_layer_map) + 1)
    assert len(attentions) == unique
    assert all(sum(isinstance(m, nn.Linear) for m in a.modules()) == linears for a in attentions)


def test_shared_layers_are_the_same_objects():
    with torch.device("meta"):
        model = create_model("acort-base", 771)
    for stack in (model.encoder.layers, model.decoder.layers):
        assert len(stack) == 6 and stack.num_unique == 2
        assert stack[0] is stack[1] is stack[2]
        assert stack[3] is stack[4] is stack[5]
        assert stack[0] is not stack[3]
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == len(set(names))
    assert all(".unique.0." in k or ".unique.1." in k for k in model.state_dict() if "layers" in k)


# -- state -----------------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_state_layout_is_batch_first_and_per_position():
    model = small_model("acort-test", dec_layer_map="(0x3,1x3)")
    features, boxes, mask = visual(batch=3)
    state = model.encode(features, boxes, mask)
    assert tuple(state) == model.state_names == ("memory_bias", "cross_k", "self_k")  # Share-KV: keys only
    heads, d_k = 2, 16
    assert state["memory_bias"].shape == (3, 1, 1, 5)
    assert state["cross_k"].shape == (3, 2, heads, 5, d_k)  # one per unique decoder layer
    assert state["self_k"].shape == (3, 6, heads, 0, d_k)  # one per decoder position, empty
    _, state = model.step(torch.tensor([1, 2, 3]), state)
    _, state = model.step(torch.tensor([4, 5, 6]), state)
    assert state["self_k"].shape == (3, 6, heads, 2, d_k)
    # positions sharing a layer see different inputs, so their cache entries differ
    assert not torch.allclose(state["self_k"][:, 0], state["self_k"][:, 1])

    separate = small_model("ort-test")
    assert separate.state_names == ("memory_bias", "cross_k", "cross_v", "self_k", "self_v")
    assert set(separate.encode(features, boxes, mask)) == set(separate.state_names)


@torch.no_grad()
def test_select_state_reorders_hypotheses():
    model = small_model("acort-test-qk")
    features, boxes, mask = visual()
    tokens = tokens_for(model, length=3)
    state = model.encode(features, boxes, mask)
    _, state = model.step(tokens[:, 0], state)
    index = torch.tensor([1, 0, 1])
    reordered = model.select_state(state, index)
    logp, _ = model.step(tokens[index, 1], reordered)
    expected = model(features[index], boxes[index], mask[index], tokens[index, :2])[:, -1]
    torch.testing.assert_close(logp, expected, atol=1e-5, rtol=0)


@torch.no_grad()
def test_step_leaves_the_given_state_untouched():
    model = small_model("ort-test")
    features, boxes, mask = visual()
    state = model.encode(features, boxes, mask)
    before = {k: v.clone() for k, v in state.items()}
    _, new = model.step(torch.tensor([1, 2]), state)
    assert all(torch.equal(state[k], before[k]) for k in state)
    assert new["self_k"].shape[3] == 1 and state["self_k"].shape[3] == 0


# -- training --------------------------------------------------------------------------------------------------------


def test_gradients_reach_every_parameter():
    model = small_model("acort-test-qk").train()
    features, boxes, mask = visual()
    tokens = tokens_for(model, length=5)
    logp = model(features, boxes, mask, tokens[:, :-1])
    nn.functional.nll_loss(logp.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_tiny_model_overfits_one_batch():
    torch.manual_seed(0)
    model = small_model("acort-test", dropout=0.0, feature_dropout=0.0).train()
    features, boxes, mask = visual(batch=4, regions=6)
    tokens = tokens_for(model, batch=4, length=9)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(80):
        loss = nn.functional.nll_loss(
            model(features, boxes, mask, tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0], losses[::10]


# -- input checks ----------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    model = small_model("acort-test")
    features, boxes, mask = visual()
    tokens = tokens_for(model)
    with pytest.raises(ModelInputError, match="feature_dim=12"):
        model(torch.randn(2, 5, 7), boxes, mask, tokens)
    with pytest.raises(ModelInputError, match="boxes"):
        model(features, boxes[..., :3], mask, tokens)
    with pytest.raises(ModelInputError, match="boxes"):
        model(features, boxes[:, :4], mask, tokens)
    with pytest.raises(ModelInputError, match="feature_mask"):
        model(features, boxes, mask.float(), tokens)
    with pytest.raises(ModelInputError, match="integer"):
        model(features, boxes, mask, tokens.float())
    with pytest.raises(ModelInputError, match="max_len"):
        model(features, boxes, mask, torch.ones(2, model.max_len + 1, dtype=torch.long))
    state = model.encode(features, boxes, mask)
    with pytest.raises(ModelInputError, match="missing"):
        model.step(tokens[:, 0], {k: v for k, v in state.items() if k != "cross_k"})
    with pytest.raises(ModelInputError, match="unexpected"):
        model.step(tokens[:, 0], {**state, "self_v": state["self_k"]})
    with pytest.raises(ModelInputError, match=r"\(B,\)"):
        model.step(tokens, state)
    with pytest.raises(ModelInputError, match="memory"):
        model.start(torch.randn(2, 32))


@torch.no_grad()
def test_decoding_past_max_len_fails_loudly():
    model = small_model("ort-test", max_len=3)
    features, boxes, mask = visual()
    state = model.encode(features, boxes, mask)
    for _ in range(3):
        _, state = model.step(torch.tensor([1, 1]), state)
    with pytest.raises(ValueError, match="max_len=3"):
        model.step(torch.tensor([1, 1]), state)
