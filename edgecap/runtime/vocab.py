"""Vocabularies: one token per word (:class:`WordVocab`) or ``d`` radix digits per word (:class:`RadixVocab`).

Both rank words by descending frequency in the training captions, ties broken alphabetically (by code point), so the
same corpus always gives the same ids. Words seen fewer than ``min_count`` times (default 5, the usual COCO
threshold) map to ``<unk>``.

The radix layout (ACORT, Tan et al., §4.1) is described in :mod:`edgecap.runtime.radix_vocab`. This module builds and
loads vocabularies and is where every vocabulary name is imported from; the classes live in
:mod:`edgecap.runtime.vocab_base`, :mod:`edgecap.runtime.word_vocab` and :mod:`edgecap.runtime.radix_vocab`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from edgecap.runtime.radix_vocab import RadixVocab
from edgecap.runtime.vocab_base import (
    _FORMAT_VERSION,
    _RESERVED,
    BOS,
    DEFAULT_RADIX_BASE,
    EOS,
    PAD,
    UNK,
    VocabError,
    Vocabulary,
)
from edgecap.runtime.word_vocab import WordVocab

__all__ = [
    "PAD",
    "BOS",
    "EOS",
    "UNK",
    "RadixVocab",
    "VocabError",
    "Vocabulary",
    "WordVocab",
    "DEFAULT_RADIX_BASE",
    "build_vocab",
    "count_words",
    "load_vocab",
    "rank_words",
    "vocab_from_dict",
]


def count_words(captions: Iterable[Sequence[str]]) -> Counter[str]:
    """Word frequencies over tokenised captions, reserved specials and empty strings excluded.

    Raises:
        VocabError: a caption is a plain ``str`` (it would be counted character by character) or holds non-strings.
    """
    counts: Counter[str] = Counter()
    for n, caption in enumerate(captions):
        if isinstance(caption, str):
            raise VocabError(
                f"caption {n} is a str ({caption[:40]!r}); pass token lists, e.g. from "
                "edgecap.runtime.text.clean_caption"
            )
        for word in caption:
            if not isinstance(word, str):
                raise VocabError(f"caption {n} holds a non-string token {word!r}")
            if word and word not in _RESERVED:
                counts[word] += 1
    return counts


def rank_words(counts: Mapping[str, int], min_count: int = 5, max_size: int | None = None) -> list[str]:
    """Words with ``count >= min_count``, by descending count, ties alphabetical; at most ``max_size`` of them."""
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise VocabError(f"min_count must be a positive integer, got {min_count!r}")
    if max_size is not None and max_size < 0:
        raise VocabError(f"max_size must be >= 0, got {max_size}")
    ranked = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    return ranked if max_size is None else ranked[:max_size]


def build_vocab(
    captions: Iterable[Sequence[str]],
    kind: str = "word",
    min_count: int = 5,
    radix_base: int = DEFAULT_RADIX_BASE,
    *,
    max_size: int | None = None,
) -> Vocabulary:
    """Build a vocabulary from tokenised training captions (Algorithm 1 for ``kind="radix"``).

    Args:
        captions: token lists, e.g. ``clean_caption(raw)`` or Karpathy ``tokens`` of the training split.
        kind: ``"word"`` or ``"radix"``.
        min_count: keep words seen at least this often (default 5).
        radix_base: radix base ``v`` for ``kind="radix"`` (ACORT: 768).
        max_size: keep at most this many words (the most frequent), specials excluded.
    """
    if kind not in _KINDS:
        raise VocabError(f"unknown vocab kind {kind!r}; expected one of {sorted(_KINDS)}")
    words = rank_words(count_words(captions), min_count=min_count, max_size=max_size)
    if kind == "radix":
        return RadixVocab(words, base=radix_base, min_count=min_count)
    return WordVocab(words, min_count=min_count)


def load_vocab(path: str | Path) -> Vocabulary:
    """Read a vocabulary written by :meth:`Vocabulary.save`, dispatching on its ``"kind"`` field.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        VocabError: the file is not valid JSON, or its fields are missing or inconsistent.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"vocabulary file not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise VocabError(f"{path}: not a valid JSON vocabulary ({err})") from None
    return vocab_from_dict(data, source=str(path))


def vocab_from_dict(data: Any, source: str = "vocab") -> Vocabulary:
    """Rebuild any vocabulary from :meth:`Vocabulary.to_dict` output (e.g. embedded in a bundle config)."""
    if not isinstance(data, Mapping):
        raise VocabError(f"{source}: expected a JSON object, got {type(data).__name__}")
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:  # a list or object here is unhashable
        raise VocabError(f"{source}: field 'kind' must be one of {sorted(_KINDS)}, got {kind!r}")
    version = data.get("version", _FORMAT_VERSION)
    if version != _FORMAT_VERSION:
        raise VocabError(f"{source}: unsupported vocab format version {version!r} (this edgecap reads 1)")
    return _KINDS[kind].from_dict(data, source=source)


_KINDS: dict[str, type[WordVocab] | type[RadixVocab]] = {"word": WordVocab, "radix": RadixVocab}
