"""Caption statistics (ACORT Table 3: uniqueness and average length) on hand-made examples."""

from __future__ import annotations

import dataclasses

import pytest

from edgecap.workshop.evaluation import (
    CaptionInputError,
    CaptionStats,
    average_length,
    caption_stats,
    uniqueness,
    vocabulary,
)

GENERATED = ["A dog runs.", "a dog runs", "A cat sleeps on the sofa!", ""]
TRAIN = ["a dog runs", "a bird", ("a", "cat", "sleeps")]


def test_hand_made_example():
    stats = caption_stats(GENERATED, TRAIN)
    # "A dog runs." and "a dog runs" are training sentences once tokenised; the cat sentence is longer than the
    # training one and "" is in no training caption.
    assert stats == CaptionStats(
        num_captions=4,
        avg_length=(3 + 3 + 6 + 0) / 4,
        vocab_size=len({"a", "dog", "runs", "cat", "sleeps", "on", "the", "sofa"}),
        distinct=100.0 * 3 / 4,
        uniqueness=50.0,
        empty=1,
    )


def test_single_functions_agree_with_caption_stats():
    stats = caption_stats(GENERATED, TRAIN)
    assert average_length(GENERATED) == stats.avg_length
    assert vocabulary(GENERATED) == {"a", "dog", "runs", "cat", "sleeps", "on", "the", "sofa"}
    assert uniqueness(GENERATED, TRAIN) == stats.uniqueness


def test_repeated_captions_count_every_time():
    generated = ["a man riding a horse"] * 3 + ["a horse in a field"]
    assert uniqueness(generated, ["a man riding a horse"]) == 25.0
    assert caption_stats(generated).distinct == 50.0


def test_a_model_that_parrots_the_training_set():
    train = [f"a photo of thing {i}" for i in range(10)]
    stats = caption_stats(train[:4] * 5, train)
    assert stats.uniqueness == 0.0
    assert stats.distinct == 20.0
    assert stats.avg_length == 5.0


def test_tokens_and_strings_are_the_same_caption():
    as_tokens = [["a", "dog", "runs"], ("two", "cats")]
    as_text = ["A dog runs.", "Two cats"]
    assert caption_stats(as_tokens, [["two", "cats"]]) == caption_stats(as_text, ["two cats!"])


def test_uniqueness_is_none_without_training_captions():
    assert caption_stats(["a dog"]).uniqueness is None


def test_average_length_of_nothing_is_zero():
    assert average_length([]) == 0.0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: caption_stats([]), "empty set of captions"),
        (lambda: uniqueness([], ["a"]), "empty set of captions"),
        (lambda: caption_stats("a dog runs"), "single str"),
        (lambda: caption_stats([["a", 3]]), "tokens must be str"),
        (lambda: caption_stats([42]), "must be a str or a sequence"),
        (lambda: caption_stats(["a dog"], []), "train_captions is empty"),
        (lambda: uniqueness(["a dog"], iter([])), "train_captions is empty"),
    ],
)
def test_bad_input_is_rejected(call, match):
    with pytest.raises(CaptionInputError, match=match):
        call()


def test_to_dict_round_trip_and_frozen():
    stats = caption_stats(GENERATED, TRAIN)
    assert CaptionStats.from_dict(stats.to_dict()) == stats
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.avg_length = 1.0  # type: ignore[misc]
    with pytest.raises(CaptionInputError, match="uniqueness"):
        CaptionStats.from_dict({k: v for k, v in stats.to_dict().items() if k != "uniqueness"})
