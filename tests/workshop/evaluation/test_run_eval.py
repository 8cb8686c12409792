import json

import pytest

from edgecap.workshop.evaluation.run_eval import evaluate_run
from edgecap.workshop.runs import load_run
from edgecap.workshop.training.checkpoint import RunError
from edgecap.workshop.training.config import TrainCfg
from edgecap.workshop.training.loop import train


@pytest.fixture(scope="module")
def tiny_run(tiny_data, tmp_path_factory):
    data, feats = tiny_data
    out = tmp_path_factory.mktemp("run") / "run"
    cfg = TrainCfg(
        model="ort-test",
        data=str(data),
        features=str(feats),
        out=str(out),
        epochs=2,
        batch_size=8,
        lr=3e-3,
        warmup_steps=2,
        optimizer="adamw",
        vocab_min_count=1,
        val_images=4,
        device="cpu",
    )
    return train(cfg, progress=False)


def test_evaluate_run_scores_and_writes_results(tiny_run):
    result, predictions = evaluate_run(tiny_run, split="test", beam=2, tokenizer="simple", metrics=("bleu", "cider"))
    assert len(predictions) == result.num_images > 0
    assert result.scores["CIDEr-D"] is not None and result.scores["BLEU-4"] is not None
    saved = json.loads((tiny_run / "eval" / "test-beam2.json").read_text())
    assert saved["images"] == result.num_images and saved["beam"] == 2
    assert json.loads((tiny_run / "eval" / "test-beam2-captions.json").read_text()) == predictions


def test_unknown_split_is_a_clear_error(tiny_run):
    with pytest.raises((ValueError, KeyError)):
        evaluate_run(tiny_run, split="nope", tokenizer="simple", write=False)


def test_vocab_that_does_not_match_the_weights_is_refused(tiny_run, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_run, broken)
    vocab = json.loads((broken / "vocab.json").read_text())
    vocab["words"] = vocab["words"][:-1]
    vocab.pop("size", None)
    (broken / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(ValueError):
        load_run(broken)


def test_missing_run_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGECAP_HOME", str(tmp_path))
    with pytest.raises(RunError, match="edgecap train --model acort-small"):
        load_run("acort-small")
