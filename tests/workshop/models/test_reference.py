"""The ``*-ref`` configs differ from their default configs only in the documented switches (docs/import.md)."""

from __future__ import annotations

import pytest
import torch

from edgecap.workshop.models import create_model, get_model_cfg, list_models
from edgecap.workshop.models.layers.norm import AnnotatedLayerNorm
from edgecap.workshop.models.reference import (
    EXPANSIONNET_REFERENCE_SWITCHES,
    IMAGE_TRANSFORMER_REFERENCE_SWITCHES,
    ORT_REFERENCE_SWITCHES,
)

PAIRS = {
    "ort-base-ref": ("ort-base", ORT_REFERENCE_SWITCHES),
    "acort-base-ref": ("acort-base", ORT_REFERENCE_SWITCHES),
    "acort-small-ref": ("acort-small", ORT_REFERENCE_SWITCHES),
    "acort-xsmall-ref": ("acort-xsmall", ORT_REFERENCE_SWITCHES),
    "ort-test-ref": ("ort-test", ORT_REFERENCE_SWITCHES),
    "acort-test-ref": ("acort-test", ORT_REFERENCE_SWITCHES),
    "expansionnet-v2-ref": ("expansionnet-v2", EXPANSIONNET_REFERENCE_SWITCHES),
    "image-transformer-ref": ("image-transformer", IMAGE_TRANSFORMER_REFERENCE_SWITCHES),
    "image-transformer-test-ref": ("image-transformer-test", IMAGE_TRANSFORMER_REFERENCE_SWITCHES),
}


def test_every_reference_config_is_listed_here():
    assert sorted(PAIRS) == list_models("*-ref")


@pytest.mark.parametrize("ref", sorted(PAIRS))
def test_a_reference_config_differs_from_its_default_only_in_the_switches(ref: str):
    base, switches = PAIRS[ref]
    ours, theirs = get_model_cfg(base).to_dict(), get_model_cfg(ref).to_dict()
    assert {k for k in ours if ours[k] != theirs[k]} == set(switches)
    assert get_model_cfg(ref) == get_model_cfg(base).replace(**switches)


def test_the_ort_switches_build_the_annotated_layernorm_and_change_the_function():
    torch.manual_seed(0)
    ref = create_model("acort-test-ref", vocab_size=771, feature_dim=24).eval()
    default = create_model("acort-test", vocab_size=771, feature_dim=24).eval()
    default.load_state_dict(ref.state_dict())  # same tensors: LayerNorm weight/bias names do not change
    assert isinstance(ref.encoder.norm, AnnotatedLayerNorm)
    feats = torch.randn(1, 5, 24)
    boxes = torch.rand(1, 5, 4) * 0.5
    boxes[..., 2:] += boxes[..., :2]
    with torch.no_grad():
        gap = (ref.encode_memory(feats, boxes, None) - default.encode_memory(feats, boxes, None)).abs().max()
    assert gap > 1e-3
