"""Importing official ExpansionNet v2 checkpoints: fused expansion projections, vocabulary order, Swin-L -> timm."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from edgecap.workshop.interop import CheckpointError, convert_checkpoint
from edgecap.workshop.interop._swin import official_swin_to_timm
from tests.workshop.interop.helpers import check_destinations, load_fixture, official_state

# The official vocabulary sorts its specials among the words (demo_coco_tokens.pickle: EOS 77, PAD 78, SOS 79, UNK 80).
IDX2WORD = ["a", "EOS", "dog", "PAD", "SOS", "UNK", "cat", "man", "on", "the", "with", "of", "in", "red"]


def _tokens(path: Path, **extra: object) -> Path:
    data = {"idx2word_list": IDX2WORD, "word2idx_dict": {w: i for i, w in enumerate(IDX2WORD)},
            "sos_str": "SOS", "eos_str": "EOS", **extra}  # fmt: skip
    path.write_bytes(pickle.dumps(data))
    return path


@pytest.fixture
def expansionnet(tmp_path: Path) -> tuple[dict, dict, Path, Path]:
    fixture = load_fixture("expansionnet_tiny.json")
    state = official_state(fixture, seed=3)
    torch.save({"model_state_dict": state, "epoch": 3}, tmp_path / "rf_model.pth")
    return fixture, state, tmp_path / "rf_model.pth", _tokens(tmp_path / "tokens.pickle")


def _id_map(vocab) -> dict[int, int]:
    specials = {"PAD": vocab.pad_id, "SOS": vocab.bos_id, "EOS": vocab.eos_id, "UNK": vocab.unk_id}
    return {i: specials.get(w, vocab.token_to_id(w)) for i, w in enumerate(IDX2WORD)}


def test_every_official_tensor_lands_in_the_reference_model(expansionnet):
    fixture, state, ckpt, tokens = expansionnet
    imported = convert_checkpoint("expansionnet-v2", ckpt, tokens, heads=2, enc_groups=(3, 5))
    cfg = imported.model.cfg
    assert (cfg.d_model, cfg.enc_layers, cfg.dec_layers, cfg.enc_groups, cfg.dec_slots) == (32, 2, 2, (3, 5), 2)
    assert cfg.max_len == 12 and cfg.layer_reduce and cfg.feature_dim == 1536
    assert imported.name == "expansionnet-v2-ref" and imported.backbone is None
    assert imported.vocab.words == tuple(w for w in IDX2WORD if w not in ("PAD", "SOS", "EOS", "UNK"))
    check_destinations(fixture, state, imported.model.state_dict(), _id_map(imported.vocab))


def test_the_group_lengths_must_be_given_when_they_are_not_v2s(expansionnet):
    _, _, ckpt, tokens = expansionnet
    with pytest.raises(CheckpointError, match="--enc-groups"):
        convert_checkpoint("expansionnet-v2", ckpt, tokens, heads=2)
    with pytest.raises(CheckpointError, match="sum to 9"):
        convert_checkpoint("expansionnet-v2", ckpt, tokens, heads=2, enc_groups=(4, 5))


def test_the_vocabulary_pickle_must_name_its_specials(expansionnet, tmp_path: Path):
    _, _, ckpt, _ = expansionnet
    tokens = _tokens(tmp_path / "odd.pickle", sos_str="<start>")
    with pytest.raises(CheckpointError, match="'<start>'"):
        convert_checkpoint("expansionnet-v2", ckpt, tokens, heads=2, enc_groups=(3, 5))


def test_swin_large_official_names_map_onto_timm_exactly():
    """From the fixtures: Microsoft's layout (read from the official code) -> timm's keys (recorded from timm)."""
    official = load_fixture("swin_large_official.json")["tensors"]
    timm_shapes = {k: tuple(v) for k, v in load_fixture("swin_large_timm.json")["tensors"].items()}
    state = {k: torch.empty(v, device="meta") for k, v in official.items()}
    mapped = official_swin_to_timm(state, timm_shapes, "swin")
    assert set(mapped) == set(timm_shapes)
    assert {k: tuple(v.shape) for k, v in mapped.items()} == timm_shapes
    assert mapped["layers.1.downsample.reduction.weight"] is state["layers.0.downsample.reduction.weight"]
    del state["layers.2.blocks.17.mlp.fc2.bias"]
    with pytest.raises(CheckpointError, match=r"missing \(1\): layers\.2\.blocks\.17\.mlp\.fc2\.bias"):
        official_swin_to_timm(state, timm_shapes, "swin")


def test_the_recorded_timm_key_list_is_current():
    """The Swin-L key list fixture equals what the installed timm builds (on the meta device: no memory)."""
    from edgecap.workshop.interop._swin import timm_feature_shapes

    shapes, width = timm_feature_shapes("swin_large_patch4_window12_384", 384)
    recorded = load_fixture("swin_large_timm.json")["tensors"]
    assert width == 1536 and shapes == {k: tuple(v) for k, v in recorded.items()}


def test_fixtures_are_current():
    """The JSON fixtures are what tests/workshop/interop/official_layouts.py writes."""
    from tests.workshop.interop.official_layouts import fixtures

    for name, content in fixtures().items():
        assert load_fixture(name) == content, f"{name} is stale: run python -m tests.workshop.interop.official_layouts"
