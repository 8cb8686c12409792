"""What the importers refuse, and how: vocabulary files that are not text or not JSON, checkpoints of another family,
an ACORT vocabulary that does not fit the radix base, non-float weights, flattened tensors, pickled code; and the
official decoding caps, counted as the official code counts them."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from edgecap.runtime.captioning import decode_cfg_for
from edgecap.runtime.decoding import decode
from edgecap.workshop.interop import CheckpointError, convert_checkpoint, import_checkpoint
from edgecap.workshop.runs import load_run
from edgecap.workshop.torch_runtime.captioning import decoder_for, model_decoding_overrides
from tests.workshop.interop.helpers import load_fixture, official_state, sentencepiece_vocab
from tests.workshop.interop.test_expansionnet import _tokens
from tests.workshop.interop.test_ort import IX_TO_WORD

ACORT_WORDS = [f"w{i}" for i in range(800)]  # 800 words, radix base 768: 2 digits per word
EXPANSION = {"heads": 2, "enc_groups": (3, 5)}


def _ort(tmp_path: Path, **bias: float) -> tuple[Path, Path]:
    state = official_state(load_fixture("ort_tiny.json"), seed=2)
    for index, value in bias.items():
        state["model.generator.proj.bias"][int(index.lstrip("_"))] = value
    torch.save(state, tmp_path / "model-best.pth")
    (tmp_path / "cocotalk.json").write_text(json.dumps({"ix_to_word": IX_TO_WORD}), encoding="utf-8")
    return tmp_path / "model-best.pth", tmp_path / "cocotalk.json"


def _acort(tmp_path: Path, words: list[str] = ACORT_WORDS) -> tuple[Path, Path]:
    state = official_state(load_fixture("acort_shared.json"), seed=1)
    state["model.generator.proj.bias"][770] = -1e4  # EOS (base + 2) is never emitted
    torch.save(state, tmp_path / "model_best.pth")
    return tmp_path / "model_best.pth", sentencepiece_vocab(tmp_path / "word.vocab", words)


def _expansionnet(tmp_path: Path, positions: int = 12) -> tuple[Path, Path]:
    state = official_state(load_fixture("expansionnet_tiny.json"), seed=3)
    state["pos_encoder.weight"] = torch.randn(positions, 32) * 0.2
    state["vocab_linear.bias"][1] = -1e4  # the official EOS (index 1 of IDX2WORD) is never emitted
    torch.save({"model_state_dict": state}, tmp_path / "rf_model.pth")
    return tmp_path / "rf_model.pth", _tokens(tmp_path / "tokens.pickle")


# ---- vocabulary files -------------------------------------------------------------------------------------------


def test_a_binary_acort_vocabulary_is_refused_by_name(tmp_path: Path):
    ckpt, _ = _acort(tmp_path)
    binary = tmp_path / "tokens.pickle"
    binary.write_bytes(pickle.dumps({"idx2word_list": ["\u00e9", *ACORT_WORDS]}, protocol=4))
    with pytest.raises(CheckpointError, match=r"tokens\.pickle: not a UTF-8 text vocabulary.*pickle"):
        convert_checkpoint("acort", ckpt, binary)


@pytest.mark.parametrize("source", ["expansionnet-v2", "ort"])
def test_malformed_json_vocabularies_are_refused_alike(tmp_path: Path, source: str):
    ckpt = _expansionnet(tmp_path)[0] if source == "expansionnet-v2" else _ort(tmp_path)[0]
    bad = tmp_path / "vocab.json"
    bad.write_text('{"idx2word_list": ["a", "b",', encoding="utf-8")
    options = EXPANSION if source == "expansionnet-v2" else {}
    with pytest.raises(CheckpointError, match=r"vocab\.json: not valid JSON \(line 1, column"):
        convert_checkpoint(source, ckpt, bad, **options)


# ---- checkpoints of another family --------------------------------------------------------------------------------


@pytest.mark.parametrize("words", [ACORT_WORDS, ["a", "man", "dog", "cat", "on"]], ids=["fits", "too-small"])
def test_an_ort_checkpoint_is_refused_as_acort_by_its_architecture_whatever_the_vocabulary(
    tmp_path: Path, words: list[str]
):
    # 13 output classes read as radix base 10, which 800 real words fill with 3 digits each: only the architecture
    # (4 projections per attention, no shared layers) tells ORT apart, and it is checked before the vocabulary.
    ckpt, _ = _ort(tmp_path)
    vocab = sentencepiece_vocab(tmp_path / "word.vocab", words)
    pattern = r"ORT's architecture, not ACORT's: 4 projections per attention and no shared layers.*--from ort"
    with pytest.raises(CheckpointError, match=pattern):
        convert_checkpoint("acort", ckpt, vocab)


def test_an_acort_checkpoint_is_refused_as_ort_even_when_the_sizes_fit(tmp_path: Path):
    ckpt, _ = _acort(tmp_path)  # Share-KV and shared layers, 771 output classes
    cocotalk = tmp_path / "cocotalk.json"
    cocotalk.write_text(json.dumps({"ix_to_word": {str(i + 1): f"w{i}" for i in range(770)}}), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"looks like an ACORT checkpoint.*--from acort"):
        convert_checkpoint("ort", ckpt, cocotalk)


def test_layouts_of_another_family_are_named(tmp_path: Path):
    ort_ckpt, cocotalk = _ort(tmp_path)
    exp_ckpt, tokens = _expansionnet(tmp_path)
    with pytest.raises(CheckpointError, match=r"does not hold ExpansionNet v2 weights.*--from ort or --from acort"):
        convert_checkpoint("expansionnet-v2", ort_ckpt, tokens, **EXPANSION)
    with pytest.raises(CheckpointError, match=r"does not hold ORT weights.*--from expansionnet-v2"):
        convert_checkpoint("ort", exp_ckpt, cocotalk)
    with pytest.raises(CheckpointError, match=r"JSON, not a SentencePiece word\.vocab.*--from ort"):
        convert_checkpoint("acort", _acort(tmp_path)[0], cocotalk)
    with pytest.raises(CheckpointError, match=r"SentencePiece vocabulary.*--from acort"):
        convert_checkpoint("ort", ort_ckpt, _acort(tmp_path)[1])


def test_an_acort_vocabulary_smaller_than_the_radix_base_is_refused(tmp_path: Path):
    ckpt, vocab = _acort(tmp_path)
    assert convert_checkpoint("acort", ckpt, vocab).vocab.digits == 2  # the training vocabulary: 2 digits
    small = sentencepiece_vocab(tmp_path / "small.vocab", ACORT_WORDS[:100])
    with pytest.raises(CheckpointError, match=r"100 words, fewer than the checkpoint's radix base 768.*1 digit"):
        convert_checkpoint("acort", ckpt, small)


# ---- tensors --------------------------------------------------------------------------------------------------------


def test_an_integer_output_projection_is_refused_by_name(tmp_path: Path):
    from safetensors.torch import save_file

    state = official_state(load_fixture("ort_tiny.json"), seed=2)
    state["model.generator.proj.weight"] = (state["model.generator.proj.weight"] * 10).to(torch.int32)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "m.safetensors"))
    _, cocotalk = _ort(tmp_path)
    with pytest.raises(CheckpointError, match=r"'model\.generator\.proj\.weight' is torch\.int32.*floating point"):
        convert_checkpoint("ort", tmp_path / "m.safetensors", cocotalk)


@pytest.mark.parametrize(
    ("source", "key"),
    [("ort", "att_embed.0.weight"), ("ort", "model.tgt_embed.1.pe"), ("expansionnet-v2", "vocab_linear.weight"),
     ("expansionnet-v2", "encoders.0.stc_exp.query_exp_vectors.weight"), ("expansionnet-v2", "pos_encoder.weight")],
)  # fmt: skip
def test_a_flattened_tensor_is_refused_under_its_own_name(tmp_path: Path, source: str, key: str):
    if source == "ort":
        ckpt, vocab = _ort(tmp_path)
        state, options = torch.load(ckpt), {}
    else:
        ckpt, vocab = _expansionnet(tmp_path)
        state, options = torch.load(ckpt)["model_state_dict"], EXPANSION
    state[key] = state[key].flatten()
    torch.save(state, tmp_path / "flat.pth")
    with pytest.raises(CheckpointError) as caught:
        convert_checkpoint(source, tmp_path / "flat.pth", vocab, **options)
    named = [k for k in state if repr(k) in str(caught.value) or f"'{k}'" in str(caught.value)]
    assert named == [key], str(caught.value)


def test_a_pickle_that_calls_os_system_is_refused_with_a_complete_message(tmp_path: Path):
    class Payload:
        def __reduce__(self):
            return (os.system, ("true",))

    _, vocab = _acort(tmp_path)
    torch.save({**official_state(load_fixture("acort_shared.json")), "hook": Payload()}, tmp_path / "evil.pth")
    with pytest.raises(CheckpointError) as caught:
        convert_checkpoint("acort", tmp_path / "evil.pth", vocab)
    message = str(caught.value)
    assert "--trust-pickle" in message and "system" in message and "Do it only if" not in message
    assert message.endswith("unpickling can execute arbitrary code")


# ---- feature widths: the official backbones' ---------------------------------------------------------------------


def _narrow(ckpt: Path, key: str, width: int) -> Path:
    """The checkpoint with its input projection cut to ``width`` columns (a mis-saved tensor)."""
    data = torch.load(ckpt, weights_only=True)
    state = data.get("model_state_dict", data)
    state[key] = state[key][:, :width].clone()
    torch.save(data, ckpt)
    return ckpt


@pytest.mark.parametrize(
    ("source", "key", "official"),
    [("acort", "att_embed.0.weight", 2048), ("ort", "att_embed.0.weight", 2048),
     ("expansionnet-v2", "input_linear.weight", 1536)],
)  # fmt: skip
def test_an_input_width_no_official_backbone_gives_is_named_and_refused(
    tmp_path: Path, source: str, key: str, official: int
):
    ckpt, vocab = {"acort": _acort, "ort": _ort, "expansionnet-v2": _expansionnet}[source](tmp_path)
    options = EXPANSION if source == "expansionnet-v2" else {}
    assert convert_checkpoint(source, ckpt, vocab, **options).feature_dim == official
    width = official - 1
    _narrow(ckpt, key, width)
    pattern = rf"'{key}' takes {width}-d features, a width no backbone of the official code gives \(it uses {official} "
    with pytest.raises(CheckpointError, match=pattern + rf".*--feature-dim {width}$"):
        convert_checkpoint(source, ckpt, vocab, **options)
    # Features of one's own: the width is confirmed explicitly, and must be the checkpoint's.
    imported = convert_checkpoint(source, ckpt, vocab, feature_dim=width, **options)
    assert imported.feature_dim == width and imported.model.cfg.feature_dim == width
    assert f"input width {width}: features of your own (--feature-dim {width})" in imported.notes
    with pytest.raises(CheckpointError, match=rf"--feature-dim {official}, but the input projection.* {width}-d"):
        convert_checkpoint(source, ckpt, vocab, feature_dim=official, **options)


def test_the_cli_names_the_width_and_writes_nothing(tmp_path: Path):
    from click.testing import CliRunner

    from edgecap.cli import main

    ckpt, vocab = _acort(tmp_path)
    _narrow(ckpt, "att_embed.0.weight", 2047)
    args = ["import", "--from", "acort", str(ckpt), "--vocab", str(vocab), "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and "takes 2047-d features" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()
    result = CliRunner().invoke(main, [*args, "--feature-dim", "2047"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["feature_dim"] == 2047


# ---- decoding caps: the official maximum caption lengths ---------------------------------------------------------


def _greedy_words(run: Path) -> tuple[int, list[str], bool]:
    """The decode config's token cap, a greedy caption of the imported run (whose EOS is never chosen) and whether
    the caption ended with an EOS."""
    trained = load_run(run)
    cfg = decode_cfg_for(
        trained.vocab, beam_size=1, max_words=trained.max_words, **model_decoding_overrides(trained.model)
    )
    gen = torch.Generator().manual_seed(0)
    fd = trained.model.cfg.feature_dim
    inputs = {"features": torch.randn(1, 5, fd, generator=gen), "boxes": torch.rand(1, 5, 4, generator=gen).sort(-1)[0],
              "feature_mask": torch.ones(1, 5, dtype=torch.bool)}  # fmt: skip
    hyp = decode(decoder_for(trained.model), inputs, cfg)[0][0]
    return cfg.max_len, trained.vocab.decode(list(hyp.tokens)), hyp.finished


def test_ort_decodes_at_most_the_official_seq_length_of_16(tmp_path: Path):
    # ORT's _sample: for t in range(seq_length + 1), t = 0 feeds BOS, at t == seq_length it stops: 16 tokens, EOS
    # counted among them, so an unfinished caption has 16 words.
    ckpt, vocab = _ort(tmp_path, _0=-1e4)  # official id 0 is the end token: never emitted
    run = import_checkpoint("ort", ckpt, tmp_path / "run", vocab=vocab)
    max_len, words, finished = _greedy_words(run)
    assert max_len == 16 and len(words) == 16 and not finished


def test_acort_decodes_at_most_the_13_words_of_max_seq_length_26(tmp_path: Path):
    # ACORT's max_seq_length 26 counts generated radix tokens, EOS included: 13 complete words of 2 digits.
    ckpt, vocab = _acort(tmp_path)
    run = import_checkpoint("acort", ckpt, tmp_path / "run", vocab=vocab)
    max_len, words, finished = _greedy_words(run)
    assert load_run(run).max_words == 13 and len(words) == 13 and "<unk>" not in words
    # 26 digit tokens, then a 27th step where no word fits and only EOS would be legal: not run, so the caption ends
    # unfinished after 13 words, as the official search stops at max_seq_length (see docs).
    assert max_len == 27 and not finished


def test_expansionnet_decodes_at_most_what_beam_max_seq_len_20_allows(tmp_path: Path):
    # beam_search(max_seq_len=20) grows [SOS, w1] while time_step < 20: 20 tokens with SOS, 19 generated.
    ckpt, tokens = _expansionnet(tmp_path, positions=74)
    run = import_checkpoint("expansionnet-v2", ckpt, tmp_path / "run", vocab=tokens, **EXPANSION)
    max_len, words, finished = _greedy_words(run)
    assert max_len == 19 and len(words) == 19 and not finished


def test_the_cli_refuses_an_ort_checkpoint_given_as_acort_without_writing_a_run(tmp_path: Path):
    from click.testing import CliRunner

    from edgecap.cli import main

    ckpt, _ = _ort(tmp_path)
    vocab = sentencepiece_vocab(tmp_path / "word.vocab", ["a", "man", "dog"])
    args = ["import", "--from", "acort", str(ckpt), "--vocab", str(vocab), "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and "--from ort" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()
