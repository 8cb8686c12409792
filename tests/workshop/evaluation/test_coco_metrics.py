"""evaluate_captions against pycocoevalcap's own scorers, plus unavailability, input errors and the report formats.

Java-needing tests are marked ``java`` and skipped without a ``java`` on PATH. The JVM-heavy work (PTB tokenizer,
METEOR: ~6 s per start) runs once, in two session fixtures: one ``evaluate_captions`` call and one direct
pycocoevalcap run on the same captions.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import subprocess

import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge
from rich.console import Console

from edgecap.workshop.evaluation import (
    CaptionInputError,
    EvalResult,
    MissingJavaError,
    TokenizerError,
    caption_stats,
    evaluate_captions,
    format_markdown,
    format_table,
    print_result,
    ptb_tokenize,
    simple_tokenize,
    spice_unavailable_reason,
)
from edgecap.workshop.evaluation import coco as coco_module
from tests.workshop.evaluation.conftest import make_raw_set

HAVE_JAVA = shutil.which("java") is not None
java = pytest.mark.skipif(not HAVE_JAVA, reason="needs a `java` executable on PATH (PTB tokenizer / METEOR)")
NUM_IMAGES = 20
# The fixture set has one empty prediction on purpose; tests that check that warning use pytest.warns.
pytestmark = pytest.mark.filterwarnings("ignore:.*predictions are empty after tokenisation:UserWarning")


def _pycoco_scores(gts, res, with_meteor):
    """Corpus and per-image scores of pycocoevalcap's scorers, called directly."""
    out = {}
    corpus, per_image = Bleu(4).compute_score(gts, res, verbose=0)
    for n in range(4):
        out[f"BLEU-{n + 1}"] = (corpus[n], list(per_image[n]))
    for name, scorer in (("ROUGE-L", Rouge()), ("CIDEr-D", Cider())):
        corpus, per_image = scorer.compute_score(gts, res)
        out[name] = (corpus, list(per_image))
    if with_meteor:
        from pycocoevalcap.meteor.meteor import Meteor

        corpus, per_image = Meteor().compute_score(gts, res)
        out["METEOR"] = (corpus, list(per_image))
    return out


def _assert_same_scores(result, expected):
    assert set(expected) <= set(result.scores)
    for name, (corpus, per_image) in expected.items():
        assert result[name] == pytest.approx(corpus, rel=1e-12, abs=1e-15), name
        assert result.per_image[name] == pytest.approx(per_image, rel=1e-12, abs=1e-15), name


@pytest.fixture(scope="session")
def raw_set():
    return make_raw_set(NUM_IMAGES)


@pytest.fixture(scope="session")
def ptb_result(raw_set):
    """The one full evaluate_captions run with the PTB tokenizer and METEOR."""
    if not HAVE_JAVA:
        pytest.skip("needs java")
    preds, refs = raw_set
    with pytest.warns(UserWarning, match="empty after tokenisation"):
        return evaluate_captions(preds, refs, train_captions=[r for group in refs.values() for r in group])


@pytest.fixture(scope="session")
def pycoco_reference(raw_set):
    """pycocoevalcap end to end, as COCOEvalCap does it: its PTBTokenizer, then its scorers (one METEOR run)."""
    if not HAVE_JAVA:
        pytest.skip("needs java")
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    preds, refs = raw_set
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({k: [{"caption": c} for c in refs[k]] for k in preds})
    res = tokenizer.tokenize({k: [{"caption": preds[k]}] for k in preds})
    return gts, res, _pycoco_scores(gts, res, with_meteor=True)


@pytest.mark.java
@java
def test_ptb_evaluation_reproduces_pycocoevalcap(ptb_result, pycoco_reference):
    _, _, expected = pycoco_reference
    _assert_same_scores(ptb_result, expected)
    assert ptb_result.tokenizer == "ptb"
    assert ptb_result.num_images == NUM_IMAGES
    assert ptb_result.image_ids == tuple(f"img{i}" for i in range(NUM_IMAGES))
    assert 0.3 < ptb_result["CIDEr-D"] < 5 and 0.1 < ptb_result["METEOR"] < 1  # a meaningful fixture


@pytest.mark.java
@java
def test_ptb_tokenize_matches_pycocoevalcap_tokenizer(raw_set, pycoco_reference):
    preds, refs = raw_set
    gts, res, _ = pycoco_reference
    keys = list(preds)
    ours = ptb_tokenize([preds[k] for k in keys] + [r for k in keys for r in refs[k]])
    assert ours == [res[k][0] for k in keys] + [r for k in keys for r in gts[k]]
    assert "" in ours and any("'s" in line for line in ours)  # the fixture has an empty caption and a clitic


@pytest.mark.java
@java
def test_ptb_tokenize_handles_unicode_empty_and_line_breaks():
    captions = ["Café au lait, please.", "", "   ", "two\nlines\u2028here", "...!", "a\rb\x0bc", "A man's T-shirt."]
    out = ptb_tokenize(captions)
    # pycocoevalcap's PTBTokenizer would split "\u2028", "\r" and "\x0b" into extra lines and misalign the rest.
    assert out == ["café au lait please", "", "", "two lines here", "", "a b c", "a man 's t-shirt"]


@pytest.mark.java
@java
def test_spice_is_unavailable_not_zero_without_its_jars(ptb_result):
    if spice_unavailable_reason() is None:
        pytest.skip("SPICE's CoreNLP jars are installed here")
    assert ptb_result["SPICE"] is None
    assert "stanford-corenlp-3.6.0" in ptb_result.unavailable["SPICE"]
    assert "SPICE" not in ptb_result.per_image


@pytest.mark.java
@java
def test_ptb_result_statistics_and_warnings(ptb_result, raw_set):
    preds, refs = raw_set
    train = [r for group in refs.values() for r in group]
    assert ptb_result.stats == caption_stats(list(preds.values()), train)
    assert ptb_result.stats.uniqueness is not None and 0 < ptb_result.stats.uniqueness < 100
    assert any("empty after tokenisation" in w for w in ptb_result.warnings)


@pytest.mark.parametrize(
    ("returncode", "stdout", "match"),
    [(0, b"a dog\n", "returned 1 lines for 2 captions"), (1, b"", "exited with status 1: boom")],
)
def test_ptb_tokenizer_failures_are_reported(monkeypatch, returncode, stdout, match):
    def fake_run(cmd, **kwargs):
        assert cmd[3:] == [coco_module._PTB_CLASS, "-preserveLines", "-lowerCase", "-encoding", "utf-8"]
        return subprocess.CompletedProcess(cmd, returncode, stdout=stdout, stderr=b"boom")

    monkeypatch.setattr(coco_module, "java_executable", lambda: "/usr/bin/java")
    monkeypatch.setattr(coco_module.subprocess, "run", fake_run)
    with pytest.raises(TokenizerError, match=match):
        ptb_tokenize(["A dog.", "A cat."])


def test_simple_tokenizer_reproduces_pycocoevalcap_on_the_same_tokens(raw_set):
    preds, refs = raw_set
    result = evaluate_captions(preds, refs, metrics=("bleu", "rouge", "cider"), tokenizer="simple")
    gts = {k: [simple_tokenize(r) for r in refs[k]] for k in preds}
    res = {k: [simple_tokenize(preds[k])] for k in preds}
    _assert_same_scores(result, _pycoco_scores(gts, res, with_meteor=False))
    assert result.tokenizer == "simple"
    assert set(result.scores) == {"BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr-D"}
    assert not result.unavailable


def test_token_lists_score_like_strings():
    preds = {"a": "a dog runs on the grass", "b": "two cats sleep", "c": "a red bus"}
    refs = {"a": ["a dog running on grass", "the dog runs"], "b": ["two cats sleeping", "cats asleep"], "c": ["a bus"]}
    tokens_preds = {k: v.split() for k, v in preds.items()}
    tokens_refs = {k: [r.split() for r in v] for k, v in refs.items()}
    kwargs = {"metrics": ("bleu", "rouge", "cider"), "tokenizer": "simple"}
    assert evaluate_captions(tokens_preds, tokens_refs, **kwargs) == evaluate_captions(preds, refs, **kwargs)
    # pycocoevalcap's own format, a one-element list per prediction, is accepted as well.
    in_lists = {k: [v] for k, v in preds.items()}
    assert evaluate_captions(in_lists, refs, **kwargs) == evaluate_captions(preds, refs, **kwargs)


@pytest.fixture
def no_java(monkeypatch):
    """Pretend no Java is installed, and fail loudly if anything still tries to start a JVM scorer."""
    monkeypatch.setattr(coco_module.shutil, "which", lambda name: None)

    def forbidden(*args, **kwargs):
        raise AssertionError("a Java-based scorer was started without Java")

    monkeypatch.setattr("pycocoevalcap.meteor.meteor.Meteor.__init__", forbidden)
    monkeypatch.setattr("pycocoevalcap.spice.spice.Spice.__init__", forbidden)


def test_missing_java_raises_with_install_instructions(no_java, raw_set):
    preds, refs = raw_set
    with pytest.raises(MissingJavaError) as info:
        evaluate_captions(preds, refs)
    message = str(info.value)
    assert "apt-get install default-jre-headless" in message
    assert "tokenizer='simple'" in message
    assert isinstance(info.value, FileNotFoundError)


def test_without_java_simple_tokenizer_scores_and_marks_meteor_unavailable(no_java, raw_set):
    preds, refs = raw_set
    result = evaluate_captions(preds, refs, tokenizer="simple")
    for name in ("BLEU-4", "ROUGE-L", "CIDEr-D"):
        assert isinstance(result[name], float)
    assert result["METEOR"] is None and "java" in result.unavailable["METEOR"]
    assert result["SPICE"] is None and result.unavailable["SPICE"]
    assert "METEOR" not in result.per_image


def test_auto_tokenizer_falls_back_to_simple_without_java(no_java, raw_set):
    preds, refs = raw_set
    with pytest.warns(UserWarning, match="simple tokenizer"):
        result = evaluate_captions(preds, refs, metrics=("cider",), tokenizer="auto")
    assert result.tokenizer == "simple"
    assert any("simple tokenizer" in w for w in result.warnings)


def test_spice_download_is_never_triggered(monkeypatch):
    if spice_unavailable_reason() is None:
        pytest.skip("SPICE's CoreNLP jars are installed here")

    def forbidden(*args, **kwargs):
        raise AssertionError("SPICE tried to download or start")

    monkeypatch.setattr("pycocoevalcap.spice.get_stanford_models.urlretrieve", forbidden)
    monkeypatch.setattr("pycocoevalcap.spice.spice.Spice.__init__", forbidden)
    result = evaluate_captions({"a": "a dog"}, {"a": ["a dog"]}, metrics="spice", tokenizer="simple")
    assert result.scores == {"SPICE": None}
    assert "stanford-corenlp-3.6.0.jar" in result.unavailable["SPICE"]


def test_a_crashing_java_scorer_is_unavailable_and_the_rest_survive(monkeypatch):
    def crashed_jvm(gts, res):
        raise ValueError("could not convert string to float: ''")

    monkeypatch.setattr(coco_module, "java_executable", lambda: "/usr/bin/java")
    monkeypatch.setitem(coco_module._RUNNERS, "meteor", crashed_jvm)
    preds, refs = {"a": "a dog", "b": "a cat"}, {"a": ["a dog runs"], "b": ["a cat"]}
    with pytest.warns(UserWarning, match="METEOR failed: ValueError"):
        result = evaluate_captions(preds, refs, metrics=("meteor", "cider"), tokenizer="simple")
    assert result["METEOR"] is None and result.unavailable["METEOR"].startswith("METEOR failed")
    assert result["CIDEr-D"] is not None

    monkeypatch.setitem(coco_module._RUNNERS, "cider", crashed_jvm)  # a pure-Python scorer failing is a bug
    with pytest.raises(ValueError, match="could not convert"):
        evaluate_captions(preds, refs, metrics=("cider",), tokenizer="simple")


def test_empty_predictions_are_scored_as_zero_with_a_warning():
    preds = {"a": "", "b": "a cat on a mat", "c": "   "}
    refs = {"a": ["a dog runs"], "b": ["a cat sits on a mat"], "c": ["a bird"]}
    with pytest.warns(UserWarning, match="2 of 3 predictions are empty"):
        result = evaluate_captions(preds, refs, metrics=("bleu", "rouge", "cider"), tokenizer="simple")
    for name in ("BLEU-1", "ROUGE-L", "CIDEr-D"):
        assert result.per_image[name][0] == 0.0 and result.per_image[name][2] == 0.0
        assert result.per_image[name][1] > 0.0
    assert result.stats.empty == 2


def test_single_image_warns_that_cider_needs_a_corpus_and_still_computes():
    with pytest.warns(UserWarning, match="CIDEr-D needs a corpus"):
        result = evaluate_captions({"x": "a dog"}, {"x": ["a dog", "a puppy"]}, metrics="cider", tokenizer="simple")
    assert result["CIDEr-D"] == 0.0


@pytest.mark.parametrize(
    ("preds", "refs", "match"),
    [
        ({"a": "x", "b": "y"}, {"a": ["x"]}, "1 predicted image id\\(s\\) have no references: 'b'"),
        ({"a": "x"}, {"a": ["x"], 7: ["y"], "c": ["z"]}, "2 referenced image id\\(s\\) have no prediction: 'c', 7"),
        ({}, {}, "no predictions"),
        ({"a": "x"}, {"a": "x y"}, "references for image 'a' must be a list of captions, got str"),
        ({"a": "x"}, {"a": []}, "image 'a' has no reference captions"),
        ({"a": ["a dog", "a cat"]}, {"a": ["x"]}, "several captions"),
        ({"a": 3}, {"a": ["x"]}, "prediction for image 'a' must be a str"),
        ({"a": "x"}, {"a": [["x", None]]}, "reference 0 of image 'a': tokens must be str"),
        ({1: "x", "1": "y"}, {1: ["x"], "1": ["y"]}, "collide"),
        (["x"], {"a": ["x"]}, "predictions must be a mapping"),
    ],
)
def test_bad_input_is_rejected_with_a_clear_message(preds, refs, match):
    with pytest.raises(CaptionInputError, match=match) as info:
        evaluate_captions(preds, refs, metrics="cider", tokenizer="simple")
    assert isinstance(info.value, ValueError)


def test_unknown_metric_or_tokenizer_is_rejected():
    with pytest.raises(CaptionInputError, match="unknown metric 'bertscore'"):
        evaluate_captions({"a": "x"}, {"a": ["x"]}, metrics=("cider", "bertscore"), tokenizer="simple")
    with pytest.raises(CaptionInputError, match="unknown tokenizer 'nltk'"):
        evaluate_captions({"a": "x"}, {"a": ["x"]}, tokenizer="nltk")


# --- report: EvalResult and its formats -------------------------------------------------------------------------


@pytest.fixture
def simple_result(raw_set):
    preds, refs = raw_set
    with pytest.warns(UserWarning):
        return evaluate_captions(preds, refs, metrics=("bleu", "cider", "spice"), tokenizer="simple")


def test_result_json_round_trip(simple_result, tmp_path):
    path = tmp_path / "eval" / "result.json"
    simple_result.save(path)
    assert EvalResult.load(path) == simple_result
    summary = json.loads(simple_result.to_json())
    assert "per_image" not in summary and summary["num_images"] == NUM_IMAGES
    assert summary["metrics"]["CIDEr-D"] == simple_result["CIDEr-D"]
    assert EvalResult.from_dict(summary).image_ids == ()
    assert EvalResult.from_dict(summary).scores == simple_result.scores


def test_result_is_immutable(simple_result):
    with pytest.raises(dataclasses.FrozenInstanceError):
        simple_result.tokenizer = "ptb"  # type: ignore[misc]
    with pytest.raises(TypeError):
        simple_result.scores["CIDEr-D"] = 99.0  # type: ignore[index]
    with pytest.raises(KeyError, match="METEOR"):
        simple_result["METEOR"]


def test_result_rejects_inconsistent_fields(simple_result):
    with pytest.raises(CaptionInputError, match="no score and no reason"):
        dataclasses.replace(simple_result, unavailable={})
    with pytest.raises(CaptionInputError, match="unavailable. reason but a score"):
        dataclasses.replace(simple_result, unavailable={**simple_result.unavailable, "CIDEr-D": "?"})
    with pytest.raises(CaptionInputError, match="do not match"):
        dataclasses.replace(simple_result, per_image={"CIDEr-D": (1.0,)})


def test_nan_scores_are_written_as_null_and_read_back(simple_result):
    weird = dataclasses.replace(simple_result, scores={**simple_result.scores, "BLEU-1": math.nan})
    data = json.loads(weird.to_json(per_image=True))
    assert data["metrics"]["BLEU-1"] is None
    assert math.isnan(EvalResult.from_dict(data)["BLEU-1"])


def test_load_names_the_broken_file(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(CaptionInputError, match="broken.json"):
        EvalResult.load(bad)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"metrics": {}}))
    with pytest.raises(CaptionInputError, match="partial.json.*num_images"):
        EvalResult.load(partial)


def test_markdown_and_rich_table(simple_result):
    markdown = format_markdown(simple_result)
    cider_line = f"| CIDEr-D | {simple_result['CIDEr-D'] * 100:.1f} |"
    assert cider_line in markdown
    assert "| SPICE | n/a |" in markdown
    assert "- SPICE unavailable: " in markdown
    assert "| unique: not in training set (%) | n/a (no training captions given) |" in markdown
    assert f"| CIDEr-D | {simple_result['CIDEr-D']:.3f} |" in format_markdown(simple_result, scale=1, digits=3)

    console = Console(record=True, width=120)
    console.print(format_table(simple_result, title="val"))
    print_result(simple_result, console=console)
    text = console.export_text()
    assert "CIDEr-D" in text and "BLEU-4" in text and "n/a" in text
    assert f"{simple_result['CIDEr-D'] * 100:.1f}" in text
