"""Building blocks: layer maps, box geometry, attention sharing and masking, norms, positions, layer stacks."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from edgecap.workshop.models.layers.attention import (
    MASK_VALUE,
    MultiHeadAttention,
    attention_weights,
    causal_bias,
    mask_to_bias,
)
from edgecap.workshop.models.layers.geometry import (
    LOG_MIN_WEIGHT,
    GeometricBias,
    box_relational_angles,
    box_relational_embedding,
    box_relational_features,
)
from edgecap.workshop.models.layers.layer_map import LayerMapError, format_layer_map, parse_layer_map
from edgecap.workshop.models.layers.norm import AnnotatedLayerNorm, make_norm
from edgecap.workshop.models.layers.position import SinusoidalPositions, sinusoid_table
from edgecap.workshop.models.layers.transformer import EncoderLayer, LayerStack

# -- layer maps (ACORT §4.2) -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("(0x3,1x3)", (0, 0, 0, 1, 1, 1)),
        ("(0x2)", (0, 0)),
        ("(0x6)", (0,) * 6),
        ("(0,0,1,1,2,2)", (0, 0, 1, 1, 2, 2)),
        ("(0, 1, 2, 2, 1, 0)", (0, 1, 2, 2, 1, 0)),
        ("0x3, 1x3", (0, 0, 0, 1, 1, 1)),
        ("[0×2,1]", (0, 0, 1)),
        ((0, 1), (0, 1)),
        ([0, 0, 1], (0, 0, 1)),
    ],
)
def test_parse_layer_map(spec, expected):
    assert parse_layer_map(spec) == expected


@pytest.mark.parametrize("spec", ["", "()", "(0x)", "(ax3)", "(0x0)", "(1x2)", "(0,2)", "(0,-1)", [0, "1"], [], 3])
def test_parse_layer_map_rejects(spec):
    with pytest.raises(LayerMapError):
        parse_layer_map(spec)


@pytest.mark.parametrize("layer_map", [(0, 0, 0, 1, 1, 1), (0, 1, 2, 3, 4, 5), (0, 0), (0, 0, 1), (0, 1, 1, 0)])
def test_format_layer_map_round_trips(layer_map):
    assert parse_layer_map(format_layer_map(layer_map)) == layer_map
    assert format_layer_map((0, 0, 0, 1, 1, 1)) == "(0x3,1x3)"


# -- box-relational geometry (ORT §3.2) --------------------------------------------------------------------------


def test_box_relational_features_by_hand():
    # A: centre (0.2, 0.4), size 0.2 x 0.4; B: centre (0.7, 0.3), size 0.4 x 0.2.
    boxes = torch.tensor([[[0.1, 0.2, 0.3, 0.6], [0.5, 0.2, 0.9, 0.4]]])
    feats = box_relational_features(boxes)
    assert feats.shape == (1, 2, 2, 4)
    log = math.log
    expected = torch.tensor(
        [
            [[log(1e-3), log(1e-3), 0.0, 0.0], [log(0.5 / 0.2), log(0.1 / 0.4), log(0.5), log(2.0)]],
            [[log(0.5 / 0.4), log(0.1 / 0.2), log(2.0), log(0.5)], [log(1e-3), log(1e-3), 0.0, 0.0]],
        ]
    )
    torch.testing.assert_close(feats[0], expected, atol=1e-5, rtol=1e-5)


def test_box_relational_features_reference_offset():
    # The reference's +1.0 on widths/heights: w_A = 1.2, w_B = 1.4.
    boxes = torch.tensor([[[0.1, 0.2, 0.3, 0.6], [0.5, 0.2, 0.9, 0.4]]])
    feats = box_relational_features(boxes, wh_offset=1.0)
    assert feats[0, 0, 1, 0].item() == pytest.approx(math.log(0.5 / 1.2), abs=1e-6)
    assert feats[0, 0, 1, 2].item() == pytest.approx(math.log(1.2 / 1.4), abs=1e-6)


def test_degenerate_boxes_stay_finite():
    boxes = torch.zeros(2, 3, 4)  # e.g. padding rows
    assert torch.isfinite(box_relational_embedding(boxes)).all()


def test_box_relational_embedding_layout():
    boxes = torch.tensor([[[0.1, 0.2, 0.3, 0.6], [0.5, 0.2, 0.9, 0.4]]])
    emb = box_relational_embedding(boxes)
    assert emb.shape == (1, 2, 2, 64)
    feats = box_relational_features(boxes)[0, 0, 1] * 100.0
    for k in range(4):  # feature-major: 4 features x 8 frequencies, then [sin | cos]
        for j in range(8):
            angle = feats[k].item() / 1000.0 ** (j / 8)
            assert emb[0, 0, 1, k * 8 + j].item() == pytest.approx(math.sin(angle), abs=1e-4)
            assert emb[0, 0, 1, 32 + k * 8 + j].item() == pytest.approx(math.cos(angle), abs=1e-4)
    # identical boxes: Δx = Δy = log(1e-3) and Δw = Δh = 0 -> cos half of the size features is exactly 1
    assert emb[0, 0, 0, 0].item() == pytest.approx(math.sin(100 * math.log(1e-3)), abs=1e-4)
    assert torch.allclose(emb[0, 0, 0, 32 + 16 : 64], torch.ones(16))
    assert torch.allclose(emb[0, 0, 0, 16:32], torch.zeros(16))
    with pytest.raises(ValueError, match="multiple of 8"):
        box_relational_embedding(boxes, dim=60)


def test_box_angles_are_the_elementwise_angles():
    """Pair angles (Δx, Δy): the block-diagonal frequency matmul gives the reference's products bit for bit. Box
    angles: 100 · log(size) per box at each frequency, whose differences are the Δw, Δh angles."""
    torch.manual_seed(0)
    xy = torch.rand(2, 7, 2) * 0.6
    boxes = torch.cat([xy, xy + torch.rand(2, 7, 2) * 0.4 + 1e-3], -1)
    angles = box_relational_angles(boxes)
    freqs = 1000.0 ** (-torch.arange(8, dtype=torch.float32) / 8)
    reference = (box_relational_features(boxes) * 100.0)[..., None] * freqs  # (B, N, N, 4, 8)
    pair = reference[..., :2, :].flatten(-2).permute(0, 3, 1, 2)  # channel-major (B, 16, N, N)
    assert angles.pair_sin.shape == angles.pair_cos.shape == (2, 16, 7, 7)
    assert torch.equal(angles.pair_sin, pair.sin())
    assert torch.equal(angles.pair_cos, pair.cos())
    sizes = torch.stack([boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]], 1).log() * 100.0
    box = (sizes[:, :, None, :] * freqs[:, None]).flatten(1, 2)  # (B, 16, N)
    assert angles.box_sin.shape == (2, 16, 7)
    torch.testing.assert_close(angles.box_sin, box.sin(), atol=1e-4, rtol=0)
    torch.testing.assert_close(angles.box_cos, box.cos(), atol=1e-4, rtol=0)


def test_geometric_bias_is_the_reference_projection_of_the_embedding():
    """The matmuls over :class:`BoxAngles` = ``log(max(ReLU(Linear(E)), 1e-6))`` on the paper's embedding."""
    torch.manual_seed(0)
    xy = torch.rand(2, 6, 2) * 0.6
    boxes = torch.cat([xy, xy + torch.rand(2, 6, 2) * 0.4 + 1e-3], -1)
    geo = GeometricBias(64, heads=4)
    with torch.no_grad():
        geo.proj.bias.add_(0.5)  # most weights positive: the comparison is not all floors
        reference = torch.relu(geo.proj(box_relational_embedding(boxes))).clamp_min(1e-6).log().permute(0, 3, 1, 2)
        bias = geo(box_relational_angles(boxes))
    assert bias.shape == (2, 4, 6, 6)
    assert (reference > LOG_MIN_WEIGHT).float().mean() > 0.5
    # the Δw, Δh angle-difference identities round differently from sin/cos of the rounded difference (angles up
    # to ~700 rad); log ω amplifies that where ω is small
    torch.testing.assert_close(bias, reference, atol=2e-3, rtol=1e-3)


def test_zero_geometric_weight_is_a_near_hard_mask():
    # Four boxes with the same centre and widths 0.1, 0.2, 0.4, 0.8. W_G reads only the lowest-frequency cos(Δw)
    # channel: ω = ReLU(100·cos − 99) is 1 for equal widths and 0 for any width ratio >= 2.
    widths = torch.tensor([0.1, 0.2, 0.4, 0.8])
    boxes = torch.stack([0.5 - widths / 2, 0.4 + 0 * widths, 0.5 + widths / 2, 0.6 + 0 * widths], -1)[None]
    geo = GeometricBias(64, heads=2)
    with torch.no_grad():
        geo.proj.weight.zero_()
        geo.proj.weight[:, 32 + 2 * 8 + 7] = 100.0
        geo.proj.bias.fill_(-99.0)
    bias = geo(box_relational_angles(boxes))
    assert bias.shape == (1, 2, 4, 4)
    off_diag = ~torch.eye(4, dtype=torch.bool)
    assert torch.allclose(bias[0, :, off_diag], torch.full((2, 12), LOG_MIN_WEIGHT))
    assert torch.allclose(bias[0, :, ~off_diag], torch.zeros(2, 4), atol=1e-3)
    q = torch.zeros(1, 2, 4, 8)  # no content signal: attention is decided by geometry alone
    probs = attention_weights(q, q, bias)
    assert (probs.diagonal(dim1=-2, dim2=-1) > 0.9999).all()

    # ω ≡ 1 contributes log 1 = 0: geometry then leaves attention untouched
    with torch.no_grad():
        geo.proj.weight.zero_()
        geo.proj.bias.fill_(1.0)
    assert torch.equal(geo(box_relational_angles(boxes)), torch.zeros(1, 2, 4, 4))


def test_encoder_layer_geometry_changes_attention():
    torch.manual_seed(0)
    layer = EncoderLayer(16, 2, 32, 0.0, None, "standard", geometry_dim=64).eval()
    x = torch.randn(1, 5, 16)
    xy = torch.rand(1, 5, 2) * 0.5
    boxes_a = torch.cat([xy, xy + 0.3], -1)
    boxes_b = torch.cat([xy, xy + torch.rand(1, 5, 2) * 0.5 + 0.05], -1)
    bias = mask_to_bias(None, x)
    out_a = layer(x, bias, box_relational_angles(boxes_a))
    out_b = layer(x, bias, box_relational_angles(boxes_b))
    assert not torch.allclose(out_a, out_b, atol=1e-4)
    with pytest.raises(ValueError, match="box embedding"):
        layer(x, bias, None)


# -- attention -----------------------------------------------------------------------------------------------------


def _linears(module: nn.Module) -> int:
    return sum(isinstance(m, nn.Linear) for m in module.modules())


@pytest.mark.parametrize(("share", "count"), [(None, 4), ("kv", 3), ("qk", 3)])
def test_attention_sharing_drops_one_projection(share, count):
    attn = MultiHeadAttention(16, 4, share)
    assert _linears(attn) == count
    assert sum(p.numel() for p in attn.parameters()) == count * (16 * 16 + 16)


def test_share_kv_reuses_the_key_projection():
    attn = MultiHeadAttention(16, 4, "kv")
    x, mem = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    k, v = attn.project_memory(mem)
    assert v is k and k.shape == (2, 4, 5, 4)
    q, k, v = attn.project_self(x)
    assert v is k
    assert not attn.separate_values


def test_share_qk_reuses_the_query_projection():
    attn = MultiHeadAttention(16, 4, "qk")
    x = torch.randn(2, 3, 16)
    q, k, v = attn.project_self(x)
    assert k is q and v is not q
    k_mem, _ = attn.project_memory(x)
    torch.testing.assert_close(k_mem, q)


def test_attention_matches_torch_sdpa():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, None).eval()
    x, mem = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    ours = attn(x, mem, mask_to_bias(mask, mem))

    def heads(t):
        return t.unflatten(-1, (4, 4)).transpose(1, 2)

    ref = nn.functional.scaled_dot_product_attention(
        heads(attn.q_proj(x)), heads(attn.k_proj(mem)), heads(attn.v_proj(mem)), attn_mask=mask[:, None, None, :]
    )
    ref = attn.out_proj(ref.transpose(1, 2).flatten(2))
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_masks_are_finite_and_fp16_safe():
    mem = torch.randn(2, 4, 8)
    mask = torch.tensor([[True, True, False, False], [False, False, False, False]])
    bias = mask_to_bias(mask, mem)
    assert bias.shape == (2, 1, 1, 4)
    assert bias[0, 0, 0].tolist() == [0.0, 0.0, MASK_VALUE, MASK_VALUE]
    assert torch.isfinite(torch.tensor(MASK_VALUE, dtype=torch.float16))
    q = torch.randn(2, 1, 3, 8)
    probs = attention_weights(q, mem[:, None], bias)
    assert torch.isfinite(probs).all()
    assert probs[0, ..., 2:].max() < 1e-30  # padded keys get no weight
    # a fully padded row (a uniform −1e4 shift) is an ordinary softmax, never NaN as with -inf
    # (up to the float32 resolution of scores shifted by 1e4)
    torch.testing.assert_close(probs[1], attention_weights(q[1:], mem[1:, None])[0], atol=1e-3, rtol=0)
    assert mask_to_bias(None, mem).abs().sum() == 0

    causal = causal_bias(3, mem)
    assert causal.shape == (1, 1, 3, 3)
    assert causal[0, 0].tolist() == [[0.0, MASK_VALUE, MASK_VALUE], [0.0, 0.0, MASK_VALUE], [0.0, 0.0, 0.0]]


def test_attention_rejects_bad_settings():
    with pytest.raises(ValueError, match="sharing"):
        MultiHeadAttention(16, 4, "vq")
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(18, 4)


# -- norms and positions -------------------------------------------------------------------------------------------


def test_annotated_layer_norm_is_the_reference_formula():
    torch.manual_seed(0)
    x = torch.randn(3, 10)
    norm = AnnotatedLayerNorm(10)
    with torch.no_grad():
        norm.weight.uniform_()
        norm.bias.uniform_()
    expected = norm.weight * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-6) + norm.bias
    torch.testing.assert_close(norm(x), expected)
    standard = make_norm("standard", 10)
    assert isinstance(standard, nn.LayerNorm)
    assert not torch.allclose(make_norm("annotated", 10)(x), standard(x), atol=1e-3)  # unbiased std differs
    assert sum(p.numel() for p in norm.parameters()) == sum(p.numel() for p in standard.parameters()) == 20
    with pytest.raises(ValueError, match="layer_norm"):
        make_norm("rms", 10)


def test_sinusoid_table_values():
    table = sinusoid_table(7, 8)
    assert table.shape == (7, 8)
    assert table[0].tolist() == [0.0, 1.0] * 4
    assert table[5, 0].item() == pytest.approx(math.sin(5.0), abs=1e-6)
    assert table[5, 1].item() == pytest.approx(math.cos(5.0), abs=1e-6)
    assert table[5, 6].item() == pytest.approx(math.sin(5.0 / 10000 ** (6 / 8)), abs=1e-6)
    with pytest.raises(ValueError, match="even"):
        sinusoid_table(3, 5)


def test_positions_refuse_to_run_past_max_len():
    pos = SinusoidalPositions(8, max_len=4)
    assert pos(3, 1).shape == (1, 8)
    assert "table" not in pos.state_dict()  # checkpoints do not depend on max_len
    with pytest.raises(ValueError, match="max_len=4"):
        pos(4, 1)


# -- layer stacks ----------------------------------------------------------------------------------------------------


def test_layer_stack_shares_modules_and_stores_them_once():
    stack = LayerStack((0, 0, 0, 1, 1, 1), lambda: nn.Linear(4, 4))
    assert len(stack) == 6 and stack.num_unique == 2
    assert stack[0] is stack[1] is stack[2]
    assert stack[3] is stack[5] and stack[0] is not stack[3]
    assert [m for m in stack] == [stack[i] for i in range(6)]
    assert sum(p.numel() for p in stack.parameters()) == 2 * 20
    assert sorted(stack.state_dict()) == ["unique.0.bias", "unique.0.weight", "unique.1.bias", "unique.1.weight"]
