"""Caption statistics beyond n-gram metrics: novelty, length and vocabulary (ACORT Table 3).

ACORT (Table 3) reports the *uniqueness* of generated captions, the percentage not found verbatim in the training
set, and their average word count; compact models tend to fall back on memorised training sentences, which
these numbers expose while BLEU/CIDEr do not. We also report the vocabulary a model actually uses and the share of
distinct captions among its outputs (a model that says the same sentence for every image scores low on both).

Captions are compared as word sequences. Strings are tokenised with :func:`edgecap.runtime.text.clean_caption`
(lower-case, punctuation stripped: the Karpathy pipeline the training data went through); token sequences are
taken as already tokenised that way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from edgecap.runtime.text import clean_caption
from edgecap.workshop.evaluation._inputs import CaptionInputError

__all__ = ["CaptionStats", "average_length", "caption_stats", "caption_words", "uniqueness", "vocabulary"]

Caption = str | Sequence[str]


@dataclass(frozen=True)
class CaptionStats:
    """Statistics of a set of generated captions.

    Attributes:
        num_captions: number of captions.
        avg_length: mean number of words per caption (ACORT Table 3, "average word count").
        vocab_size: number of distinct words used over all captions.
        distinct: percentage of captions that are distinct from each other (100 = no caption repeated).
        uniqueness: percentage of captions not found in the training set (ACORT Table 3, "Unique (%)"); ``None``
            when no training captions were given.
        empty: number of captions with no words.
    """

    num_captions: int
    avg_length: float
    vocab_size: int
    distinct: float
    uniqueness: float | None
    empty: int

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> CaptionStats:
        """Inverse of :meth:`to_dict`.

        Raises:
            CaptionInputError: a field is missing.
        """
        missing = [name for name in cls.__dataclass_fields__ if name not in data]
        if missing:
            raise CaptionInputError(f"caption stats lack field(s) {', '.join(missing)}")
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})  # type: ignore[arg-type]


def caption_words(caption: Caption) -> tuple[str, ...]:
    """The words of one caption: a string through ``clean_caption``, a token sequence as is.

    Raises:
        CaptionInputError: neither a string nor a sequence of strings.
    """
    if isinstance(caption, str):
        return tuple(clean_caption(caption))
    if isinstance(caption, bytes) or not isinstance(caption, Sequence):
        raise CaptionInputError(f"a caption must be a str or a sequence of str tokens, got {type(caption).__name__}")
    words = tuple(caption)
    for word in words:
        if not isinstance(word, str):
            raise CaptionInputError(f"caption tokens must be str, got {type(word).__name__} ({word!r})")
    return words


def _as_words(captions: Iterable[Caption]) -> list[tuple[str, ...]]:
    if isinstance(captions, str):
        raise CaptionInputError("expected a collection of captions, got a single str")
    return [caption_words(c) for c in captions]


def _train_set(train_captions: Iterable[Caption]) -> set[tuple[str, ...]]:
    seen = set(_as_words(train_captions))
    if not seen:
        raise CaptionInputError("train_captions is empty: uniqueness against an empty training set is meaningless")
    return seen


def average_length(captions: Iterable[Caption]) -> float:
    """Mean number of words per caption (ACORT Table 3); 0.0 for no captions."""
    words = _as_words(captions)
    return sum(map(len, words)) / len(words) if words else 0.0


def vocabulary(captions: Iterable[Caption]) -> set[str]:
    """The distinct words used by the captions."""
    return {w for caption in _as_words(captions) for w in caption}


def uniqueness(captions: Iterable[Caption], train_captions: Iterable[Caption]) -> float:
    """Percentage of ``captions`` not found verbatim in ``train_captions`` (ACORT Table 3, "Unique (%)").

    Every generated caption counts, repeats included, as in the paper's per-caption percentage.

    Raises:
        CaptionInputError: no captions, an empty training set, or malformed captions.
    """
    words = _as_words(captions)
    if not words:
        raise CaptionInputError("uniqueness of an empty set of captions is undefined")
    seen = _train_set(train_captions)
    return 100.0 * sum(caption not in seen for caption in words) / len(words)


def caption_stats(captions: Iterable[Caption], train_captions: Iterable[Caption] | None = None) -> CaptionStats:
    """All statistics of :class:`CaptionStats` in one pass over the captions.

    Args:
        captions: generated captions (strings or word tokens).
        train_captions: the training set's captions, for ``uniqueness``; ``None`` leaves it ``None``.

    Raises:
        CaptionInputError: no captions, an empty training set, or malformed captions.
    """
    words = _as_words(captions)
    if not words:
        raise CaptionInputError("caption statistics of an empty set of captions are undefined")
    unique: float | None = None
    if train_captions is not None:
        seen = _train_set(train_captions)
        unique = 100.0 * sum(caption not in seen for caption in words) / len(words)
    return CaptionStats(
        num_captions=len(words),
        avg_length=sum(map(len, words)) / len(words),
        vocab_size=len({w for caption in words for w in caption}),
        distinct=100.0 * len(set(words)) / len(words),
        uniqueness=unique,
        empty=sum(not caption for caption in words),
    )
