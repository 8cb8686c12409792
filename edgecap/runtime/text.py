"""Caption text cleaning: the COCO / Karpathy word pipeline.

Karpathy's preprocessing (neuraltalk2 ``prepro.py``) lower-cases a caption, *deletes* every ASCII punctuation
character and splits on whitespace, so ``"A man's T-shirt."`` becomes ``["a", "mans", "tshirt"]``. The tokens in
``dataset_coco.json`` were produced that way, and a vocabulary built from raw COCO captions must agree with them.

We keep that rule for the characters that join a word (apostrophes and hyphens), and differ in two places:

* every other punctuation or symbol character becomes a *space*, so ``"dog,cat"`` and ``"and/or"`` give two words
  instead of Karpathy's ``"dogcat"`` / ``"andor"`` (rare in COCO, but these glued words are pure noise in a vocab);
* text is Unicode-normalised (NFKD) and combining accents are dropped, so ``"café"``, ``"cafe\\u0301"`` and
  ``"ｃａｆé"`` all give ``"cafe"``; letters and digits of every script are kept, invisible format characters
  (zero-width joiner, soft hyphen, BOM) are deleted.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

__all__ = ["clean_caption", "truncate_words"]

# Characters deleted outright: they join the two halves of one word ("man's" -> "mans", "t-shirt" -> "tshirt").
_JOINERS = frozenset(
    "'`\u00b4\u2018\u2019\u201b\u02bc\u2032"  # apostrophes, acute/grave accents used as apostrophes, prime
    "-\u2010\u2011\u2012\u2013\u2014\u2015\u2212"  # hyphen-minus, hyphens, dashes, minus sign
)


def _map_char(ch: str) -> str:
    if ch.isalnum():
        return ch
    if ch in _JOINERS:
        return ""
    category = unicodedata.category(ch)
    if category == "Mn" or category == "Cf":  # combining marks left by NFKD; zero-width / format characters
        return ""
    return " "


def clean_caption(text: str, *, max_words: int | None = None) -> list[str]:
    """Turn a raw caption into lower-case word tokens, the COCO / Karpathy way.

    Args:
        text: a raw caption, e.g. ``"A man's bike, parked."``.
        max_words: keep at most this many words (``None``: all).

    Returns:
        The words, e.g. ``["a", "mans", "bike", "parked"]``; an empty list for a caption with no letters or digits.

    Raises:
        TypeError: ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"clean_caption expects a str, got {type(text).__name__}")
    normalised = unicodedata.normalize("NFKD", text).lower()
    # lower() can itself produce combining marks (e.g. "İ" -> "i̇"), so map characters after lowering.
    words = "".join(_map_char(ch) for ch in normalised).split()
    return truncate_words(words, max_words)


def truncate_words(words: Sequence[str], max_words: int | None) -> list[str]:
    """Keep the first ``max_words`` words (all of them when ``max_words`` is ``None``).

    Raises:
        ValueError: ``max_words`` is negative.
    """
    if max_words is None:
        return list(words)
    if max_words < 0:
        raise ValueError(f"max_words must be >= 0, got {max_words}")
    return list(words[:max_words])
