"""``edgecap import`` end to end: an official-layout ACORT checkpoint becomes a run that exports, passes parity and
captions identically on torch and ONNX Runtime; an end-to-end ExpansionNet v2 checkpoint brings its Swin and the
official preprocessing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from edgecap.cli import main
from edgecap.workshop.interop import IMPORT_RECORD, CheckpointError, import_checkpoint
from tests.workshop.interop.helpers import load_fixture, official_state, sentencepiece_vocab

WORDS = [f"w{i}" for i in range(800)]


@pytest.fixture
def acort_files(tmp_path: Path) -> tuple[Path, Path]:
    state = official_state(load_fixture("acort_shared.json"), seed=4)
    state["model.generator.proj.bias"][770] = -30.0  # random weights would end at once: greedy runs long
    torch.save(state, tmp_path / "model_best.pth")
    return tmp_path / "model_best.pth", sentencepiece_vocab(tmp_path / "word.vocab", WORDS)


def test_the_cli_writes_a_run_that_loads(acort_files, tmp_path: Path):
    ckpt, vocab = acort_files
    run = tmp_path / "run"
    result = CliRunner().invoke(
        main, ["import", "--from", "acort", str(ckpt), "--vocab", str(vocab), "--out", str(run)]
    )
    assert result.exit_code == 0, result.output
    assert "acort-base-ref" in result.output
    from edgecap.workshop.runs import load_run

    trained = load_run(run)
    assert trained.model.cfg.layer_norm == "annotated" and trained.vocab.size == 771 and trained.max_words == 13
    record = json.loads((run / IMPORT_RECORD).read_text())
    assert record["from"] == "acort" and len(record["checkpoint_sha256"]) == 64
    again = CliRunner().invoke(main, ["import", "--from", "acort", str(ckpt), "--vocab", str(vocab), "--out", str(run)])
    assert again.exit_code != 0 and "--overwrite" in again.output


def test_the_cli_reports_a_bad_checkpoint_in_one_line(tmp_path: Path):
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not a checkpoint")
    result = CliRunner().invoke(
        main, ["import", "--from", "ort", str(bad), "--vocab", str(bad), "--out", str(tmp_path / "r")]
    )
    assert result.exit_code != 0 and "not a readable torch checkpoint" in result.output
    assert not (tmp_path / "r").exists()


def test_an_imported_acort_run_exports_and_captions_identically_on_torch_and_onnxruntime(
    acort_files, tiny_data, tmp_path: Path
):
    from edgecap import Captioner
    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.data.sources import open_feature_source
    from edgecap.workshop.export.bundle import export_bundle
    from edgecap.workshop.runs import load_run
    from edgecap.workshop.torch_runtime.captioning import caption_bank
    from edgecap.workshop.training.batches import FeatureBank

    ckpt, vocab = acort_files
    state = torch.load(ckpt, weights_only=True)
    state["att_embed.0.weight"] = state["att_embed.0.weight"][:, :24].clone()  # the tiny bank's 24 channels
    torch.save(state, ckpt)
    run = import_checkpoint("acort", ckpt, tmp_path / "run", vocab=vocab, feature_dim=24)
    bundle = export_bundle(run, tmp_path / "bundle", progress=False)  # raises if FP32 parity fails
    trained = load_run(run)
    data, feats = tiny_data
    records = load_dataset(data).split("test") + load_dataset(data).split("val")
    bank = FeatureBank(open_feature_source(feats), [r.image_id for r in records])
    inputs = bank.batch(list(range(len(records)))).as_inputs()
    for beam in (1, 3):
        expected = caption_bank(trained.model, bank, trained.vocab, beam_size=beam, max_words=trained.max_words)
        with Captioner.load(bundle, precision="fp32", beam=beam) as cap:
            assert cap.caption_inputs(inputs) == expected
        if beam == 1:  # greedy decoding of these weights runs to the length cap: real captions, not empty ones
            assert all(len(c.split()) >= 3 for c in expected)


def test_an_end_to_end_expansionnet_checkpoint_brings_its_swin_and_the_official_preprocessing(
    tmp_path: Path, tiny_data
):
    """Swin-T stands in for Swin-L (same layout, 28 M instead of 197 M parameters)."""
    import pickle

    from edgecap import Captioner
    from tests.workshop.interop.official_layouts import EXPANSIONNET_TINY, SWIN_TINY, expansionnet

    cfg = {**EXPANSIONNET_TINY, "feature_dim": 768}
    state = official_state(expansionnet(cfg, swin=SWIN_TINY), seed=5)
    for key in [k for k in state if k.endswith("relative_position_index")]:
        state[key] = torch.zeros(state[key].shape, dtype=torch.long)  # a derived buffer: dropped by the importer
    torch.save({"model_state_dict": state}, tmp_path / "rf_model.pth")
    words = ["a", "EOS", "dog", "PAD", "SOS", "UNK", "cat", "man", "on", "the", "with", "of", "in", "red"]
    (tmp_path / "tokens.pickle").write_bytes(pickle.dumps({"idx2word_list": words, "sos_str": "SOS", "eos_str": "EOS"}))
    run = import_checkpoint(
        "expansionnet-v2", tmp_path / "rf_model.pth", tmp_path / "run", vocab=tmp_path / "tokens.pickle",
        heads=2, enc_groups=(3, 5), backbone="swin_tiny_patch4_window7_224", image_size=224,
    )  # fmt: skip
    spec = json.loads((run / "config.json").read_text())["backbone"]
    assert spec["crop_mode"] == "squash" and spec["interpolation"] == "bilinear" and spec["crop_pct"] == 1.0
    assert spec["weights"]["file"] == "backbone.safetensors" and spec["grid"] == [7, 7]
    with pytest.raises(Exception, match="backbone_weights"):
        Captioner.from_run(run)
    cap = Captioner.from_run(run, beam=1, backbone_weights=run / "backbone.safetensors")
    assert cap.backbone.preprocess_cfg.crop_mode == "squash"
    assert cap.backbone.preprocess_cfg.interpolation == "bilinear"
    swin = cap.backbone.model.state_dict()
    assert torch.equal(
        swin["layers.1.downsample.reduction.weight"], state["swin_transf.layers.0.downsample.reduction.weight"]
    )
    assert len(cap.batch([tiny_data[0] / "images" / "000000.png"])) == 1


def test_import_refuses_an_unknown_source(tmp_path: Path):
    with pytest.raises(CheckpointError, match="unknown source"):
        import_checkpoint("blip", tmp_path / "x.pth", tmp_path / "run")


def test_the_cli_passes_expansionnet_options_and_trust_pickle(tmp_path: Path):
    import argparse
    import pickle

    state = official_state(load_fixture("expansionnet_tiny.json"), seed=6)
    torch.save({"model_state_dict": state, "args": argparse.Namespace(N_enc=2)}, tmp_path / "rf_model.pth")
    words = ["a", "EOS", "dog", "PAD", "SOS", "UNK", "cat", "man", "on", "the", "with", "of", "in", "red"]
    (tmp_path / "tokens.pickle").write_bytes(pickle.dumps({"idx2word_list": words, "sos_str": "SOS", "eos_str": "EOS"}))
    files = [str(tmp_path / "rf_model.pth"), "--vocab", str(tmp_path / "tokens.pickle"), "--out", str(tmp_path / "run")]
    args = ["import", "--from", "expansionnet-v2", *files, "--heads", "2", "--enc-groups", "3,5"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code != 0 and "--trust-pickle" in refused.output and not (tmp_path / "run").exists()
    result = CliRunner().invoke(main, [*args, "--trust-pickle", "--max-words", "8"])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model"]["cfg"]["enc_groups"] == [3, 5] and config["model"]["cfg"]["heads"] == 2
    assert config["train"]["max_words"] == 8 and config["backbone"] is None
    too_long = CliRunner().invoke(main, [*args, "--trust-pickle", "--overwrite", "--max-words", "40"])
    assert too_long.exit_code != 0 and "max_words must be in [1, 11]" in too_long.output
