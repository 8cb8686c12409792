"""What every vocabulary shares: the special tokens, :class:`Vocabulary`, :class:`VocabError` and the checks of words
and saved fields that :mod:`edgecap.runtime.word_vocab` and :mod:`edgecap.runtime.radix_vocab` both apply.

Kept apart from the two layouts so each can be read (and changed) alone; :mod:`edgecap.runtime.vocab` is the public
entry point and re-exports everything here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from edgecap.runtime._io import atomic_write_json
from edgecap.runtime.text import truncate_words

__all__ = ["PAD", "BOS", "EOS", "UNK", "DEFAULT_RADIX_BASE", "VocabError", "Vocabulary"]

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
_RESERVED = frozenset({PAD, BOS, EOS, UNK})
_FORMAT_VERSION = 1
DEFAULT_RADIX_BASE = 768


class VocabError(ValueError):
    """A vocabulary file or argument is malformed or inconsistent."""


# --------------------------------------------------------------------------------------------------------------------
# Base class


class Vocabulary(ABC):
    """Maps words to model token ids and back.

    Attributes:
        kind: ``"word"`` or ``"radix"`` (the ``"kind"`` field of the saved JSON).
        pad_id, bos_id, eos_id: special token ids.
        unk_id: the ``<unk>`` token id (``None`` for radix, where ``<unk>`` is a word index, not a token).
        size: number of model output classes.
        tokens_per_word: tokens emitted per word (1 for words, ``digits`` for radix).
        words: the in-vocabulary words in rank order (most frequent first), specials excluded.
        min_count: the frequency threshold the vocab was built with (metadata; ``None`` if unknown).
    """

    kind: ClassVar[str]
    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int | None
    words: tuple[str, ...]
    min_count: int | None
    _known: frozenset[str]

    @property
    @abstractmethod
    def size(self) -> int:
        """Number of model output classes."""

    @property
    @abstractmethod
    def tokens_per_word(self) -> int:
        """Tokens emitted per word."""

    @abstractmethod
    def encode(self, words: Sequence[str]) -> list[int]:
        """Words to token ids, without BOS/EOS; words outside the vocab become ``<unk>``."""

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> list[str]:
        """Token ids to words: stops at the first EOS, skips BOS/PAD, anything invalid becomes ``"<unk>"``."""

    @abstractmethod
    def _fields(self) -> dict[str, Any]:
        """The kind-specific JSON fields (everything but ``kind``/``version``)."""

    # ---- shared behaviour -------------------------------------------------------------------------------------------

    def __contains__(self, word: object) -> bool:
        """Whether ``word`` is an in-vocabulary word (specials and ``<unk>`` are not)."""
        return isinstance(word, str) and word in self._known

    def encode_caption(self, words: Sequence[str], max_words: int | None = None) -> list[int]:
        """BOS + :meth:`encode` of the first ``max_words`` words + EOS: a teacher-forcing target.

        Truncation happens on *words*, before BOS/EOS are added, so EOS is never lost and a radix word is never cut
        in half. (The ACORT reference truncates after adding BOS/EOS, so its captions of more than 12 words train
        without EOS.) The result has ``caption_length(min(len(words), max_words))`` tokens.
        """
        return [self.bos_id, *self.encode(truncate_words(words, max_words)), self.eos_id]

    def caption_length(self, num_words: int) -> int:
        """Tokens in an :meth:`encode_caption` result of ``num_words`` words (BOS and EOS included)."""
        if num_words < 0:
            raise ValueError(f"num_words must be >= 0, got {num_words}")
        return num_words * self.tokens_per_word + 2

    def decode_text(self, ids: Iterable[int]) -> str:
        """:meth:`decode` joined with single spaces."""
        return " ".join(self.decode(ids))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description; :func:`load_vocab` / :meth:`from_dict` invert it."""
        return {"kind": self.kind, "version": _FORMAT_VERSION, **self._fields()}

    def save(self, path: str | Path) -> None:
        """Write :meth:`to_dict` as JSON, atomically (a reader never sees a half-written vocab)."""
        atomic_write_json(path, self.to_dict())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocabulary):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((self.kind, self.words, self.size))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(words={len(self.words)}, size={self.size})"


def _plain(ids: Iterable[Any]) -> Iterable[Any]:
    """numpy arrays / torch tensors to Python ints in one call (iterating them yields slow 0-d scalars)."""
    tolist = getattr(ids, "tolist", None)
    if callable(tolist):
        converted = tolist()
        return converted if isinstance(converted, list) else [converted]
    return ids


def _as_int(token: Any) -> int | None:
    """``int(token)`` for ints, numpy / torch scalars; ``None`` for anything that is not an integer value."""
    try:
        value = int(token)
    except (TypeError, ValueError, OverflowError):
        return None
    try:
        if value != token:  # rejects 1.5, accepts 1.0 / numpy / torch integers
            return None
    except Exception:  # exotic objects whose __eq__ fails: trust int()
        pass
    return value


def _check_words(words: Sequence[str], where: str) -> tuple[str, ...]:
    out = tuple(words)
    seen: set[str] = set()
    for i, word in enumerate(out):
        if not isinstance(word, str) or not word:
            raise VocabError(f"{where}: word {i} must be a non-empty string, got {word!r}")
        if word in _RESERVED:
            raise VocabError(f"{where}: word {i} is the reserved token {word!r}")
        if word in seen:
            raise VocabError(f"{where}: word {word!r} appears twice")
        seen.add(word)
    return out


def _check_min_count(min_count: Any, where: str) -> int | None:
    if min_count is None:
        return None
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise VocabError(f"{where}: min_count must be a positive integer, got {min_count!r}")
    return min_count


def _check_kind(data: Mapping[str, Any], kind: str, source: str) -> None:
    if data.get("kind") != kind:
        raise VocabError(f"{source}: field 'kind' is {data.get('kind')!r}, expected {kind!r}")


def _require_words(data: Mapping[str, Any], source: str) -> list[str]:
    words = data.get("words")
    if not isinstance(words, list):
        raise VocabError(f"{source}: field 'words' must be a list of strings, got {type(words).__name__}")
    return list(_check_words(words, source))


def _check_stored(data: Mapping[str, Any], vocab: Vocabulary, keys: Iterable[str], source: str) -> None:
    """Stored derived fields are optional, but when present they must match the layout (catches edited files)."""
    for key in keys:
        if key in data and data[key] != getattr(vocab, key):
            raise VocabError(
                f"{source}: field {key!r} is {data[key]!r} but the {vocab.kind} layout gives {getattr(vocab, key)!r}"
            )
