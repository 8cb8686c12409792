"""The fast CIDEr-D against pycocoevalcap's CiderScorer, the reference implementation it must reproduce."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.cider.cider_scorer import CiderScorer, precook

from edgecap.runtime.text import clean_caption
from edgecap.workshop.evaluation import CaptionInputError, CiderD, cider_d
from tests.workshop.evaluation.conftest import make_raw_set, make_tokenised_set

ATOL = 1e-9


def _coco_format(cands, refs):
    """Token lists -> pycocoevalcap's gts/res dicts of space-joined strings."""
    gts = {key: [" ".join(r) for r in refs[key]] for key in cands}
    res = {key: [" ".join(cands[key])] for key in cands}
    return gts, res


def _pycoco(cands, refs, **kwargs):
    gts, res = _coco_format(cands, refs)
    mean, per_image = Cider(**kwargs).compute_score(gts, res)
    return float(mean), np.asarray(per_image, dtype=np.float64)


def test_matches_pycocoevalcap_per_image_and_mean(tokenised_set):
    cands, refs = tokenised_set
    expected_mean, expected = _pycoco(cands, refs)
    scores = CiderD().score([cands[k] for k in cands], [refs[k] for k in cands])
    assert scores.shape == (50,)
    np.testing.assert_allclose(scores, expected, rtol=0, atol=ATOL)
    assert scores.mean() == pytest.approx(expected_mean, abs=ATOL)
    assert expected_mean > 0.3  # a meaningful fixture: clearly non-trivial scores
    assert (expected > 0).sum() > 30 and (expected == 0).any()


def test_compute_score_is_a_drop_in_for_pycocoevalcap(tokenised_set):
    gts, res = _coco_format(*tokenised_set)
    expected_mean, expected = Cider().compute_score(gts, res)
    mean, scores = CiderD().compute_score(gts, res)
    assert isinstance(mean, float)
    assert mean == pytest.approx(expected_mean, abs=ATOL)
    np.testing.assert_allclose(scores, expected, rtol=0, atol=ATOL)


class _OrderNCiderScorer(CiderScorer):
    """pycocoevalcap's CiderScorer with its n honoured: its ``cook_append`` always extracts 1..4-grams."""

    def cook_append(self, test, refs):
        if refs is not None:
            self.crefs.append([precook(ref, self.n) for ref in refs])
            self.ctest.append(None if test is None else precook(test, self.n, True))


@pytest.mark.parametrize(("n", "sigma"), [(4, 1.0), (4, 12.0), (1, 6.0), (2, 6.0), (3, 2.5), (5, 6.0)])
def test_other_orders_and_penalties_match_pycocoevalcap(tokenised_set, n, sigma):
    cands, refs = tokenised_set
    if n == 4:
        _, expected = _pycoco(cands, refs, n=n, sigma=sigma)
    else:
        oracle = _OrderNCiderScorer(n=n, sigma=sigma)
        for key in cands:
            oracle += (" ".join(cands[key]), [" ".join(r) for r in refs[key]])
        expected = oracle.compute_score()[1]
    scores = CiderD(n=n, sigma=sigma).score([cands[k] for k in cands], [refs[k] for k in cands])
    np.testing.assert_allclose(scores, expected, rtol=0, atol=ATOL)


def test_edge_cases_match_pycocoevalcap():
    cands = {
        "empty": [],
        "one_word": ["dog"],
        "clipped": ["dog", "dog", "dog", "dog", "runs"],
        "exact": ["a", "dog", "runs", "on", "grass"],
        "dup_refs": ["a", "cat"],
        "empty_ref": ["a", "bird", "flies"],
        "unseen": ["zebra", "quantum", "zebra"],
        "long": ["a", "dog"] * 15,
    }
    refs = {
        "empty": [["a", "dog"], ["the", "dog", "runs"]],
        "one_word": [["dog"], ["a", "dog", "runs", "on", "grass"]],
        "clipped": [["a", "dog", "runs"], ["dog", "runs", "fast"]],
        "exact": [["a", "dog", "runs", "on", "grass"], ["a", "dog", "on", "grass"]],
        "dup_refs": [["a", "cat"], ["a", "cat"], ["a", "cat", "sits"]],
        "empty_ref": [[], ["a", "bird", "in", "the", "sky"]],
        "unseen": [["a", "horse"]],
        "long": [["a", "dog", "runs"], ["dog"]],
    }
    _, expected = _pycoco(cands, refs)
    scores = CiderD().score([cands[k] for k in cands], [refs[k] for k in cands])
    np.testing.assert_allclose(scores, expected, rtol=0, atol=ATOL)
    assert scores[0] == 0.0  # empty candidate
    assert scores[3] == scores.max()  # the exact copy of a reference wins


_WORDS = st.sampled_from(["a", "b", "c", "d", "e"])
_SENTENCE = st.lists(_WORDS, min_size=0, max_size=8)
_IMAGE = st.tuples(_SENTENCE, st.lists(_SENTENCE, min_size=1, max_size=4))


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(images=st.lists(_IMAGE, min_size=1, max_size=6))
def test_random_small_sets_match_pycocoevalcap(images):
    assume(any(ref for _, group in images for ref in group))  # pycocoevalcap crashes when no reference has a word
    cands = {f"i{j}": cand for j, (cand, _) in enumerate(images)}
    refs = {f"i{j}": group for j, (_, group) in enumerate(images)}
    _, expected = _pycoco(cands, refs)
    scores = CiderD().score([cands[k] for k in cands], [refs[k] for k in cands])
    np.testing.assert_allclose(scores, expected, rtol=0, atol=ATOL)


class _CorpusCiderScorer(CiderScorer):
    """pycocoevalcap's arithmetic with document frequencies and N taken from a separate corpus (SCST's setting)."""

    def __init__(self, corpus):
        super().__init__(n=4, sigma=6.0)
        self._df = defaultdict(float)
        for group in corpus:  # counted here with plain sets, independently of CiderD
            for ngram in {g for ref in group for g in precook(" ".join(ref), 4)}:
                self._df[ngram] += 1
        self._num_docs = len(corpus)

    def corpus_scores(self):
        self.document_frequency = self._df
        num_docs = self._num_docs

        class _Refs(list):
            def __len__(self):  # compute_cider takes N = log(len(crefs)); make it the corpus size
                return num_docs

        self.crefs = _Refs(self.crefs)
        return np.asarray(self.compute_cider())


def test_corpus_document_frequencies_match_pycocoevalcap_arithmetic():
    corpus_cands, corpus_refs = make_tokenised_set(40, seed=1)
    corpus = [corpus_refs[k] for k in corpus_refs]
    cands, refs = make_tokenised_set(12, seed=2)
    cands["img5"] = ["an", "unseen", "zebra", "riding", "a", "bench"]  # words the corpus never saw
    oracle = _CorpusCiderScorer(corpus)
    for key in cands:
        oracle += (" ".join(cands[key]), [" ".join(r) for r in refs[key]])
    expected = oracle.corpus_scores()

    scorer = CiderD(corpus)
    assert scorer.num_documents == 40
    scores = scorer.score([cands[k] for k in cands], [refs[k] for k in cands])
    np.testing.assert_allclose(scores, expected, rtol=0, atol=ATOL)
    # The corpus is reusable: a second batch needs no recomputation and gives the same numbers again.
    np.testing.assert_allclose(scorer.score([cands[k] for k in cands], [refs[k] for k in cands]), scores)


def test_corpus_equal_to_the_scored_references_gives_the_coco_numbers(tokenised_set):
    cands, refs = tokenised_set
    corpus_scorer = CiderD([refs[k] for k in cands])
    scores = corpus_scorer.score([cands[k] for k in cands], [refs[k] for k in cands])
    np.testing.assert_allclose(scores, _pycoco(cands, refs)[1], rtol=0, atol=ATOL)


@pytest.mark.parametrize("with_corpus", [False, True])
def test_shared_reference_lists_count_like_separate_entries(tokenised_set, with_corpus):
    """SCST scores several samples per image against one reference list object; pycocoevalcap sees copies."""
    cands, refs = tokenised_set
    keys = list(cands)[:10]
    samples = [cands[keys[(j + 3) % 10]] for j in range(30)]  # 3 samples per image, from other images
    shared = [refs[keys[j // 3]] for j in range(30)]  # the same list object for an image's 3 samples
    copies = [[list(r) for r in refs[keys[j // 3]]] for j in range(30)]
    corpus = [refs[k] for k in cands] if with_corpus else None
    scorer = CiderD(corpus)
    np.testing.assert_allclose(scorer.score(samples, shared), scorer.score(samples, copies), rtol=0, atol=1e-12)
    if not with_corpus:
        expected = _pycoco({f"s{j}": s for j, s in enumerate(samples)}, {f"s{j}": c for j, c in enumerate(copies)})
        np.testing.assert_allclose(scorer.score(samples, shared), expected[1], rtol=0, atol=ATOL)


def test_integer_tokens_score_like_words(tokenised_set):
    cands, refs = tokenised_set
    ids: dict[str, int] = {}

    def encode(words):
        return [ids.setdefault(w, len(ids)) for w in words]

    int_cands = [encode(cands[k]) for k in cands]
    int_refs = [[encode(r) for r in refs[k]] for k in cands]
    word_scores = CiderD().score([cands[k] for k in cands], [refs[k] for k in cands])
    np.testing.assert_allclose(CiderD().score(int_cands, int_refs), word_scores, rtol=0, atol=1e-12)
    np.testing.assert_allclose(CiderD(int_refs).score(int_cands, int_refs), word_scores, rtol=0, atol=1e-12)


def test_empty_batch_gives_empty_scores():
    assert CiderD().score([], []).shape == (0,)


def test_references_without_words_score_zero():
    np.testing.assert_array_equal(CiderD().score([["a"], []], [[[]], [[], []]]), [0.0, 0.0])


@pytest.mark.parametrize(
    ("candidates", "refs", "match"),
    [
        (["a dog runs"], [[["a", "dog"]]], "candidates\\[0\\] must be a sequence of tokens"),
        ([["a"]], [[]], "refs\\[0\\] is empty"),
        ([["a"]], [["a dog"]], "refs\\[0\\]\\[0\\] must be a sequence of tokens"),
        ([["a"], ["b"]], [[["a"]]], "2 candidates but 1 reference lists"),
        ([["a"]], ["a dog"], "refs\\[0\\] must be a sequence of tokenised captions"),
    ],
)
def test_score_rejects_malformed_input(candidates, refs, match):
    with pytest.raises(CaptionInputError, match=match):
        CiderD().score(candidates, refs)


def test_constructor_rejects_bad_parameters():
    with pytest.raises(ValueError, match="n must be a positive int"):
        CiderD(n=0)
    with pytest.raises(ValueError, match="sigma must be > 0"):
        CiderD(sigma=0.0)
    with pytest.raises(ValueError, match="refs_corpus is empty"):
        CiderD([])
    with pytest.raises(CaptionInputError, match="refs_corpus\\[0\\]\\[1\\]"):
        CiderD([[["a", "b"], "a b"]])


def test_compute_score_rejects_mismatched_ids_and_multiple_candidates():
    with pytest.raises(CaptionInputError, match="different image ids"):
        CiderD().compute_score({"a": ["x y"]}, {"b": ["x"]})
    with pytest.raises(CaptionInputError, match="exactly one caption"):
        CiderD().compute_score({"a": ["x y"]}, {"a": ["x", "y"]})


def test_cider_d_helper_uses_simple_tokenisation_and_matches_pycocoevalcap():
    raw_cands, raw_refs = make_raw_set(30)
    value = cider_d(raw_cands, raw_refs)
    gts = {k: [" ".join(clean_caption(r)) for r in raw_refs[k]] for k in raw_cands}
    res = {k: [" ".join(clean_caption(raw_cands[k]))] for k in raw_cands}
    expected, _ = Cider().compute_score(gts, res)
    assert value == pytest.approx(expected, abs=ATOL)
    assert value > 0.3


def test_cider_d_helper_accepts_tokens_and_a_corpus_scorer(tokenised_set):
    cands, refs = tokenised_set
    corpus = CiderD([refs[k] for k in refs])
    expected = corpus.score([cands[k] for k in cands], [refs[k] for k in cands]).mean()
    assert cider_d(cands, refs, scorer=corpus) == pytest.approx(expected, abs=ATOL)


def test_cider_d_helper_names_missing_ids():
    with pytest.raises(CaptionInputError, match="'img2'"):
        cider_d({"img1": "a dog", "img2": "a cat"}, {"img1": ["a dog"]})


def test_cider_d_on_one_image_warns_and_is_zero():
    with pytest.warns(UserWarning, match="single image"):
        value = cider_d({"x": "a dog runs"}, {"x": ["a dog runs", "a dog"]})
    assert value == 0.0 and not math.isnan(value)
