"""``image-transformer-ref`` against the released code's formulas, worked by hand on tiny inputs: its LayerNorm, its
relation labels, where its dropouts sit; and the default's grid cells: on grid features only, never on regions."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from edgecap.workshop.models import CaptionModel, create_model, get_model_cfg
from edgecap.workshop.models.backbone import grid_boxes
from edgecap.workshop.models.layers.spatial_graph import RELATIONS, spatial_relations, tiles_image

FEATURE_DIM = 6
VOCAB = 11


def build(name: str, **overrides) -> CaptionModel:
    torch.manual_seed(0)
    return create_model(name, VOCAB, feature_dim=FEATURE_DIM, **overrides).eval()


def relation(a: list[float], b: list[float], labels: str) -> str:
    """The label of key box ``b`` seen from query box ``a``."""
    masks = spatial_relations(torch.tensor([[a, b]]), labels=labels)[0, :, 0, 1]
    return RELATIONS[int(masks.argmax())]


# -- the reference switches -------------------------------------------------------------------------------------------
def test_defaults_and_reference_switches() -> None:
    default, ref = get_model_cfg("image-transformer"), get_model_cfg("image-transformer-ref")
    assert (default.layer_norm, default.relation_labels, default.grid_scales) == ("standard", "paper", (3, 1))
    assert default.grid_scales_on == "grid"
    assert (ref.layer_norm, ref.relation_labels, ref.grid_scales) == ("annotated", "official", ())
    # the released code's max_length 20 (BOS + 19 tokens fed), where the default allows 30 words
    assert (default.max_len, ref.max_len, get_model_cfg("image-transformer-test-ref").max_len) == (31, 20, 20)
    # the released dropouts: 0.1 on attention weights, 0.1 residual, 0.3 on the AoA input, 0.5 elsewhere
    for cfg in (default, ref):
        assert (cfg.attention_dropout, cfg.residual_dropout, cfg.dropout) == (0.1, 0.1, 0.3)
        assert (cfg.feature_dropout, cfg.output_dropout) == (0.5, 0.5)


@torch.no_grad()
def test_reference_layer_norm_is_the_released_formula() -> None:
    """``a·(x − μ)/(std + 1e-6) + b`` with the unbiased std, on a 4-vector, in every LayerNorm of the model."""
    model = build("image-transformer-test-ref", d_model=4, heads=2)
    norms = [layer.norm for layer in model.encoder] + [model.encoder_norm, model.query_norm]
    x = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    a, b = torch.tensor([1.0, -1.0, 0.5, 2.0]), torch.tensor([0.0, 1.0, 0.0, -1.0])
    # μ = 3, deviations (−2, −1, 0, 3), Σ dev² = 14, unbiased std = √(14 / 3) ≈ 2.1602
    std = math.sqrt(14 / 3)
    expected = torch.tensor([[-2 / (std + 1e-6), 1 / (std + 1e-6) + 1, 0.0, 6 / (std + 1e-6) - 1]])
    for norm in norms:
        norm.weight.copy_(a)
        norm.bias.copy_(b)
        torch.testing.assert_close(norm(x), expected, atol=1e-6, rtol=0)
    # nn.LayerNorm divides by the biased std (√3.5 ≈ 1.8708): 0.2 apart on the last entry
    standard = build("image-transformer-test", d_model=4, heads=2).encoder_norm
    standard.weight.copy_(a)
    standard.bias.copy_(b)
    assert (standard(x) - expected).abs().max() > 0.1


def test_relation_labels_of_boxes_apart_on_both_axes() -> None:
    """``a`` = [0, 0.1]², ``b`` = [0.5, 0.9]²: sides min(0.1, 0.9) − max(0, 0.5) = −0.4 on both axes.

    Released code: "intersection" (−0.4)·(−0.4) = 0.16; from ``a``: 0.16 / area(a) = 0.16 / 0.01 = 16 ≥ 0.9 and
    > 0.16 / area(b) = 1, so ``b`` is ``a``'s parent and ``a`` is ``b``'s child. Eq. 5 (clamped): no overlap.
    """
    a, b = [0.0, 0.0, 0.1, 0.1], [0.5, 0.5, 0.9, 0.9]
    assert (relation(a, b, "official"), relation(b, a, "official")) == ("parent", "child")
    assert (relation(a, b, "paper"), relation(b, a, "paper")) == ("neighbour", "neighbour")
    # apart on one axis only: (0.1 − 0.5)·(0.1 − 0) = −0.04 < 0, a negative share, neighbours under both rules
    c = [0.5, 0.0, 0.9, 0.1]
    assert relation(a, c, "official") == relation(c, a, "official") == "neighbour"
    # nested boxes: both rules agree (Eq. 5)
    big, small = [0.0, 0.0, 1.0, 1.0], [0.2, 0.2, 0.4, 0.4]
    assert relation(small, big, "official") == relation(small, big, "paper") == "parent"


@torch.no_grad()
def test_reference_model_labels_relations_as_the_released_code() -> None:
    ref = build("image-transformer-test-ref")
    paper = create_model("image-transformer-test-ref", VOCAB, feature_dim=FEATURE_DIM, relation_labels="paper").eval()
    paper.load_state_dict(ref.state_dict())
    features = torch.randn(1, 2, FEATURE_DIM, generator=torch.Generator().manual_seed(1))
    apart = torch.tensor([[[0.0, 0.0, 0.1, 0.1], [0.5, 0.5, 0.9, 0.9]]])
    nested = torch.tensor([[[0.0, 0.0, 1.0, 1.0], [0.2, 0.2, 0.4, 0.4]]])
    assert (ref.encode_memory(features, apart, None) - paper.encode_memory(features, apart, None)).abs().max() > 1e-3
    torch.testing.assert_close(ref.encode_memory(features, nested, None), paper.encode_memory(features, nested, None))


def test_reference_dropouts_sit_where_the_released_code_has_them() -> None:
    """Each dropout's input, caught by a hook: attention weights (rows sum to 1) in every encoder relation and every
    decoder branch (p 0.1), the AoA input [att; LN(x)] (p 0.3), the sub-layer output before the residual (p 0.1)."""
    model = build("image-transformer-test-ref")
    seen: dict[str, list[torch.Tensor]] = {}

    def catch(name: str, module: nn.Dropout, p: float) -> None:
        assert isinstance(module, nn.Dropout) and module.p == p, name
        module.register_forward_hook(lambda _m, args, _out: seen.setdefault(name, []).append(args[0]))

    layer = model.encoder[0]
    catch("encoder attention", layer.attention_dropout, 0.1)
    catch("aoa input", layer.gate.dropout, 0.3)
    catch("residual", layer.dropout, 0.1)
    catch("decoder attention", model.attention_dropout, 0.1)
    assert model.feature_embed[2].p == 0.5 and model.output_dropout.p == 0.5
    features, boxes = torch.randn(2, 5, FEATURE_DIM), grid_boxes(1, 5).expand(2, 5, 4)
    with torch.no_grad():
        model(features, boxes, None, torch.tensor([[1, 3, 4], [1, 5, 6]]))
    d, heads = model.cfg.d_model, model.cfg.heads
    assert len(seen["encoder attention"]) == len(RELATIONS)  # one per relation, before its mask
    for weights in seen["encoder attention"]:
        assert weights.shape == (2, heads, 5, 5)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, heads, 5))
    assert [t.shape for t in seen["aoa input"]] == [(2, 5, 2 * d)]
    assert [t.shape for t in seen["residual"]] == [(2, 5, d)]
    assert len(seen["decoder attention"]) == 3  # every step
    for weights in seen["decoder attention"]:
        assert weights.shape == (2, model.cfg.branches, heads, 1, 5)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, model.cfg.branches, heads, 1))


# -- grid cells on grid features only ---------------------------------------------------------------------------------
def regions(count: int = 6, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    corner = torch.rand(1, count, 2, generator=g) * 0.6
    boxes = torch.cat((corner, corner + 0.1 + torch.rand(1, count, 2, generator=g) * 0.3), -1)
    boxes[:, 0] = torch.tensor([0.0, 0.0, 1.0, 1.0])
    return boxes


def test_tiles_image_tells_a_grid_from_regions() -> None:
    grid = grid_boxes(7, 7)[None]
    padded = torch.cat((grid, torch.zeros(1, 3, 4)), 1)  # a grid padded to a longer batch
    mask = torch.arange(52)[None] < 49
    assert tiles_image(grid, None).tolist() == [True]
    assert tiles_image(padded, mask).tolist() == [True]
    assert tiles_image(regions(), None).tolist() == [False]
    assert tiles_image(grid[:, :48], None).tolist() == [False]  # a cell short of the image
    assert tiles_image(grid * 224, None).tolist() == [False]  # pixel units are not a normalised grid


@torch.no_grad()
def test_default_adds_grid_cells_to_grid_features_only() -> None:
    """A batch of a 3×3 grid and 9 detector regions: the grid gets the coarse cells (as ``grid_scales_on="all"``),
    the regions the paper's graph (as ``grid_scales=()``), each decided per image."""
    default = build("image-transformer-test")
    always = build("image-transformer-test", grid_scales_on="all")
    plain = build("image-transformer-test", grid_scales=())
    features = torch.randn(2, 9, FEATURE_DIM, generator=torch.Generator().manual_seed(4))
    boxes = torch.cat((grid_boxes(3, 3)[None], regions(9)), 0)
    memory = default.encode_memory(features, boxes, None)
    torch.testing.assert_close(memory[:1], always.encode_memory(features[:1], boxes[:1], None), atol=1e-6, rtol=0)
    torch.testing.assert_close(memory[1:], plain.encode_memory(features[1:], boxes[1:], None), atol=1e-6, rtol=0)
    assert (memory[:1] - plain.encode_memory(features[:1], boxes[:1], None)).abs().max() > 1e-3
    assert (memory[1:] - always.encode_memory(features[1:], boxes[1:], None)).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("field", "value"), [("relation_labels", "code"), ("layer_norm", "rms"), ("grid_scales_on", "x")]
)
def test_switches_refuse_unknown_values(field: str, value: str) -> None:
    from edgecap.workshop.models import ImageTransformerCfg, ModelCfgError

    with pytest.raises(ModelCfgError, match=field):
        ImageTransformerCfg(**{field: value})


@torch.no_grad()
def test_reference_caption_length_is_the_released_max_length_20() -> None:
    """20 generated tokens at most, EOS counted: BOS + 19 fed tokens decode, one more is refused."""
    model = build("image-transformer-test-ref")
    feats, boxes = torch.randn(1, 3, FEATURE_DIM), torch.tensor([[[0.0, 0.0, 0.5, 0.5]] * 3])
    memory = model.encode_memory(feats, boxes, None)
    assert model.decode_full(memory, None, torch.ones(1, 20, dtype=torch.long)).shape == (1, 20, VOCAB)
    with pytest.raises(ValueError, match="21 tokens exceed the decoder's max_len=20"):
        model.decode_full(memory, None, torch.ones(1, 21, dtype=torch.long))
