"""Importing official ACORT checkpoints: every tensor lands where it should, shared layers collapse, vocabulary."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from edgecap.runtime.vocab import RadixVocab
from edgecap.workshop.interop import CheckpointError, convert_checkpoint
from edgecap.workshop.interop.acort import read_sentencepiece_words
from tests.workshop.interop.helpers import check_destinations, load_fixture, official_state, sentencepiece_vocab

WORDS = [f"w{i}" for i in range(800)]  # more than 768: two radix digits per word


@pytest.fixture
def acort(tmp_path: Path) -> tuple[dict, dict, Path, Path]:
    fixture = load_fixture("acort_shared.json")
    state = official_state(fixture, seed=1)
    ckpt = tmp_path / "model_best.pth"
    torch.save(state, ckpt)
    return fixture, state, ckpt, sentencepiece_vocab(tmp_path / "word.vocab", WORDS)


def test_every_official_tensor_lands_in_the_reference_model(acort):
    fixture, state, ckpt, vocab = acort
    imported = convert_checkpoint("acort", ckpt, vocab)
    cfg = imported.model.cfg
    assert cfg.enc_layer_map == (0, 0, 1) and cfg.dec_layer_map == (0, 1, 1)  # aliases collapsed
    assert cfg.layer_norm == "annotated" and cfg.box_wh_offset == 1.0 and cfg.share_att == "kv"
    assert (cfg.d_model, cfg.d_ff, cfg.heads, cfg.radix_base, cfg.feature_dim) == (32, 64, 2, 768, 2048)
    assert imported.name == "acort-base-ref"
    assert imported.overrides["enc_layer_map"] == [0, 0, 1] and "layer_norm" not in imported.overrides
    check_destinations(fixture, state, imported.model.state_dict())


def test_the_saved_aliases_are_one_tensor_and_the_model_stores_each_unique_layer_once(acort):
    fixture, state, ckpt, vocab = acort
    shared = "model.encoder.layers.{}.feed_forward.w_1.weight"
    assert state[shared.format(1)] is state[shared.format(0)]
    model = convert_checkpoint("acort", ckpt, vocab).model
    names = list(model.state_dict())
    assert sum(n.startswith("encoder.layers.unique.") and n.endswith("ffn.fc1.weight") for n in names) == 2


def test_layers_that_differ_are_not_collapsed(acort, tmp_path: Path):
    fixture, state, _, vocab = acort
    state = dict(state)
    key = "model.encoder.layers.{}.feed_forward.w_1.weight"
    state[key.format(1)] = state[key.format(0)] + 1
    torch.save(state, tmp_path / "unshared.pth")
    assert convert_checkpoint("acort", tmp_path / "unshared.pth", vocab).model.cfg.enc_layer_map == (0, 1, 2)


def test_tiny_shared_acort_matches_a_registered_reference_config(tmp_path: Path):
    from tests.workshop.interop.official_layouts import relation_transformer

    cfg = {"d": 32, "d_ff": 64, "heads": 2, "feature_dim": 2048, "vocab": 771, "enc_map": [0, 0], "dec_map": [0, 0],
           "share": "kv", "pe_len": 70}  # fmt: skip
    fixture = relation_transformer(cfg)
    torch.save(official_state(fixture), tmp_path / "m.pth")
    imported = convert_checkpoint("acort", tmp_path / "m.pth", sentencepiece_vocab(tmp_path / "v.vocab", WORDS))
    assert imported.name == "acort-test-ref" and imported.overrides == {}


@pytest.mark.parametrize("key", ["model.decoder.norm.b_2", "model.encoder.layers.0.self_attn.WGs.1.weight"])
def test_a_missing_tensor_is_an_error_that_names_it(acort, tmp_path: Path, key: str):
    _, state, _, vocab = acort
    state = {k: v for k, v in state.items() if k != key}
    torch.save(state, tmp_path / "m.pth")
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        convert_checkpoint("acort", tmp_path / "m.pth", vocab)


def test_an_unexpected_tensor_is_an_error_that_names_it(acort, tmp_path: Path):
    _, state, _, vocab = acort
    torch.save({**state, "model.encoder.extra.weight": torch.zeros(3)}, tmp_path / "m.pth")
    with pytest.raises(CheckpointError, match=r"model\.encoder\.extra\.weight"):
        convert_checkpoint("acort", tmp_path / "m.pth", vocab)


def test_a_wrong_shape_is_an_error_that_names_the_tensor(acort, tmp_path: Path):
    _, state, _, vocab = acort
    torch.save({**state, "model.decoder.norm.a_2": torch.ones(31)}, tmp_path / "m.pth")
    with pytest.raises(CheckpointError, match=r"model\.decoder\.norm\.a_2.*\(31,\)"):
        convert_checkpoint("acort", tmp_path / "m.pth", vocab)


def test_pickled_objects_need_trust_pickle_and_wrappers_and_module_prefixes_are_removed(acort, tmp_path: Path):
    fixture, state, _, vocab = acort
    wrapped = {"state_dict": {f"module.{k}": v for k, v in state.items()}, "opt": argparse.Namespace(lr=1e-4)}
    torch.save(wrapped, tmp_path / "m.pth")
    with pytest.raises(CheckpointError, match="--trust-pickle"):
        convert_checkpoint("acort", tmp_path / "m.pth", vocab)
    imported = convert_checkpoint("acort", tmp_path / "m.pth", vocab, trust_pickle=True)
    check_destinations(fixture, state, imported.model.state_dict())


def test_a_safetensors_checkpoint_saved_from_ddp_loses_its_module_prefix(acort, tmp_path: Path):
    from safetensors.torch import save_file

    fixture, state, _, vocab = acort
    save_file({f"module.{k}": v.clone().contiguous() for k, v in state.items()}, str(tmp_path / "m.safetensors"))
    imported = convert_checkpoint("acort", tmp_path / "m.safetensors", vocab)
    check_destinations(fixture, state, imported.model.state_dict())


def test_the_sentencepiece_word_list_becomes_the_radix_vocabulary(acort):
    _, _, ckpt, vocab_file = acort
    vocab = convert_checkpoint("acort", ckpt, vocab_file).vocab
    assert isinstance(vocab, RadixVocab) and vocab.size == 771 and vocab.words == tuple(WORDS)
    # SentencePiece id w -> radix index w - 4, most-significant digit first, digit k -> token k + 1.
    assert vocab.digits == 2 and vocab.encode(["w0", "w5", "w770"]) == [1, 1, 1, 6, 2, 3]
    assert vocab.decode([2, 3, 1, 6, 770]) == ["w770", "w5"]
    assert vocab.unk_index == len(WORDS)  # <unk> takes the last index, as the official tokenizer


def test_vocabulary_files_are_checked(tmp_path: Path, acort):
    _, _, ckpt, _ = acort
    bad = tmp_path / "bad.vocab"
    bad.write_text("<unk>\t0\n<pad>\t0\n<bos>\t0\n<eos>\t0\n\u2581a\t-1\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match="expected ACORT"):
        read_sentencepiece_words(bad)
    with pytest.raises(CheckpointError, match="--vocab"):
        convert_checkpoint("acort", ckpt, None)


def test_the_released_acort_base_layout_is_exactly_acort_base_ref(tmp_path: Path):
    """Full size (15 M parameters): (0x3,1x3) sharing on both sides, Share-KV, 2,048-d regions, 5,000 positions."""
    from tests.workshop.interop.official_layouts import relation_transformer

    cfg = {"d": 512, "d_ff": 2048, "heads": 8, "feature_dim": 2048, "vocab": 771, "enc_map": [0, 0, 0, 1, 1, 1],
           "dec_map": [0, 0, 0, 1, 1, 1], "share": "kv", "pe_len": 5000}  # fmt: skip
    fixture = relation_transformer(cfg)
    state = official_state(fixture, seed=7)
    torch.save(state, tmp_path / "model_best.pth")
    imported = convert_checkpoint("acort", tmp_path / "model_best.pth", sentencepiece_vocab(tmp_path / "v", WORDS))
    assert imported.name == "acort-base-ref" and imported.overrides == {} and imported.feature_dim == 2048
    assert sum(p.numel() for p in imported.model.parameters()) == 14_979_347  # ACORT's model_params.json
    check_destinations(fixture, state, imported.model.state_dict())
