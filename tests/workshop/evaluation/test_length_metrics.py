"""Control precision and diversity (LaBERT §4.6, Table 4) on hand-made examples."""

from __future__ import annotations

import pytest

from edgecap.workshop.evaluation.length import control_precision, div_n, diversity, length_histogram, self_cider


def test_control_precision_counts_words_in_range() -> None:
    caps = ["a dog", "a dog on a red sofa", "a big dog sits on the sofa."]  # 2, 6, 7 words (punctuation stripped)
    assert control_precision(caps, 1, 6) == pytest.approx(2 / 3)
    assert control_precision(caps, 7, 9) == pytest.approx(1 / 3)
    assert control_precision([], 1, 9) == 0.0
    assert length_histogram(caps) == {2: 1, 6: 1, 7: 1}
    with pytest.raises(ValueError):
        control_precision(caps, 5, 4)


def test_div_n_by_hand() -> None:
    sets = {"img": ["a dog runs", "a dog sleeps"]}  # 6 words; unigrams {a, dog, runs, sleeps}
    assert div_n(sets, 1) == pytest.approx(4 / 6)
    assert div_n(sets, 2) == pytest.approx(3 / 6)  # bigrams {a dog, dog runs, dog sleeps}
    sets["other"] = ["cat cat", "cat cat"]  # 4 words, 1 unigram, 1 bigram
    assert div_n(sets, 1) == pytest.approx((4 / 6 + 1 / 4) / 2)


def test_self_cider_is_zero_for_identical_and_one_for_disjoint_captions() -> None:
    same = {"a": ["a dog on a sofa"] * 3, "b": ["two cats in the sun"] * 3}
    assert self_cider(same) == pytest.approx(0.0, abs=1e-6)
    disjoint = {"a": ["red car", "blue sky", "green tree"], "b": ["old man", "young girl", "small boat"]}
    assert self_cider(disjoint) == pytest.approx(1.0, abs=1e-6)
    partial = {"p": ["a dog on a sofa", "a dog on a red sofa", "a cat near the window"], **disjoint}
    per_image = 3 * self_cider(partial) - 2 * 1.0  # the two disjoint images score 1 each
    assert 0.2 < per_image < 0.9  # two near-duplicates and one different caption
    assert set(diversity(same)) == {"self_cider", "div_1", "div_2"}
    with pytest.raises(ValueError, match="two or more"):
        self_cider({"a": ["one caption"]})


def test_per_level_evaluation_needs_a_length_controllable_model() -> None:
    from edgecap.workshop.evaluation.length_eval import model_levels
    from edgecap.workshop.models import LengthLevelError, create_model

    assert model_levels(create_model("labert-test", vocab_size=20, feature_dim=8))[3] == (20, 25)
    assert len(model_levels(create_model("acort-test-len", vocab_size=13, feature_dim=8, radix_base=10))) == 4
    with pytest.raises(LengthLevelError, match="no length control"):
        model_levels(create_model("ort-test", vocab_size=20, feature_dim=8))
