"""Importing official ORT checkpoints: tensors, ORT's shared start/end id 0, the UNK word, vocabulary files."""

from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path

import pytest
import torch

from edgecap.workshop.interop import CheckpointError, convert_checkpoint
from edgecap.workshop.interop._vocab import NEVER_LOGIT
from tests.workshop.interop.helpers import check_destinations, load_fixture, official_state

# ORT ids 1..12 (id 0 is the start/end token); "UNK" is an ordinary word of the preprocessed vocabulary.
IX_TO_WORD = {str(i + 1): w for i, w in enumerate(["a", "man", "UNK", "on", "dog", "the", "with", "of", "in",
                                                   "cat", "red", "sitting"])}  # fmt: skip


@pytest.fixture
def ort(tmp_path: Path) -> tuple[dict, dict, Path, Path]:
    fixture = load_fixture("ort_tiny.json")
    state = official_state(fixture, seed=2)
    torch.save(state, tmp_path / "model-best.pth")
    vocab = tmp_path / "cocotalk.json"
    vocab.write_text(json.dumps({"ix_to_word": IX_TO_WORD, "images": []}), encoding="utf-8")
    return fixture, state, tmp_path / "model-best.pth", vocab


def _id_map(vocab) -> dict[int, int]:
    """Official id -> edgecap id: 0 -> EOS (what the model emits), words by name, UNK -> <unk>."""
    out = {0: vocab.eos_id}
    for ix, word in IX_TO_WORD.items():
        out[int(ix)] = vocab.unk_id if word == "UNK" else vocab.token_to_id(word)
    return out


def test_every_official_tensor_lands_in_the_reference_model(ort):
    fixture, state, ckpt, vocab_file = ort
    imported = convert_checkpoint("ort", ckpt, vocab_file)
    assert imported.name == "ort-test-ref" and imported.overrides == {}
    cfg = imported.model.cfg
    assert cfg.layer_norm == "annotated" and cfg.box_wh_offset == 1.0 and cfg.share_att is None
    vocab = imported.vocab
    assert vocab.words == tuple(w for w in IX_TO_WORD.values() if w != "UNK")
    uncovered = {
        k: [vocab.pad_id, vocab.bos_id] for k in ("embed.embed.weight", "output_proj.weight", "output_proj.bias")
    }
    check_destinations(fixture, state, imported.model.state_dict(), _id_map(vocab), uncovered)


def test_id_zero_feeds_bos_and_emits_eos_and_the_log_probabilities_are_unchanged(ort):
    _, state, ckpt, vocab_file = ort
    imported = convert_checkpoint("ort", ckpt, vocab_file)
    model, vocab = imported.model, imported.vocab
    emb = model.state_dict()["embed.embed.weight"]
    assert torch.equal(emb[vocab.bos_id], state["model.tgt_embed.0.lut.weight"][0])
    h = torch.randn(5, 32, generator=torch.Generator().manual_seed(0))
    official = torch.log_softmax(h @ state["model.generator.proj.weight"].T + state["model.generator.proj.bias"], -1)
    ours = torch.log_softmax(model.output_proj(h), -1)
    ids = _id_map(vocab)
    assert torch.allclose(ours[:, [ids[i] for i in range(13)]], official, atol=1e-6)
    assert (ours[:, [vocab.pad_id, vocab.bos_id]] < NEVER_LOGIT / 2).all()


def test_the_infos_pickle_needs_trust_pickle(ort, tmp_path: Path):
    fixture, state, ckpt, _ = ort
    infos = tmp_path / "infos_ort-best.pkl"
    infos.write_bytes(pickle.dumps({"vocab": IX_TO_WORD, "opt": argparse.Namespace(seq_length=16)}))
    with pytest.raises(CheckpointError, match="--trust-pickle"):
        convert_checkpoint("ort", ckpt, infos)
    imported = convert_checkpoint("ort", ckpt, infos, trust_pickle=True)
    assert imported.vocab.size == 4 + 11


def test_a_vocabulary_of_another_size_is_refused(ort, tmp_path: Path):
    _, _, ckpt, _ = ort
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"ix_to_word": {"1": "a", "2": "b"}}), encoding="utf-8")
    with pytest.raises(CheckpointError, match="do not belong together"):
        convert_checkpoint("ort", ckpt, small)


def test_batchnorm_region_embeddings_are_named_as_unsupported(ort, tmp_path: Path):
    _, state, _, vocab_file = ort
    extra = {**state, "att_embed.3.running_mean": torch.zeros(32)}
    torch.save(extra, tmp_path / "bn.pth")
    with pytest.raises(CheckpointError, match=r"att_embed\.3\.running_mean"):
        convert_checkpoint("ort", tmp_path / "bn.pth", vocab_file)
