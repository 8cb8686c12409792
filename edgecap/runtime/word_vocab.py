"""The one-token-per-word vocabulary (:class:`WordVocab`); :mod:`edgecap.runtime.vocab` re-exports it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from edgecap.runtime.vocab_base import (
    BOS,
    EOS,
    PAD,
    UNK,
    Vocabulary,
    _as_int,
    _check_kind,
    _check_min_count,
    _check_stored,
    _check_words,
    _plain,
    _require_words,
)

__all__ = ["WordVocab"]


class WordVocab(Vocabulary):
    """One token per word: PAD=0, BOS=1, EOS=2, UNK=3, then the words from id 4 in rank order.

    Args:
        words: in-vocabulary words, most frequent first (no specials, no duplicates).
        min_count: metadata recorded in the saved file.
    """

    kind: ClassVar[str] = "word"
    SPECIALS: ClassVar[tuple[str, ...]] = (PAD, BOS, EOS, UNK)
    unk_id: int  # a word vocab always has <unk> (the base allows None for radix)

    def __init__(self, words: Sequence[str], *, min_count: int | None = None) -> None:
        self.words = _check_words(words, "WordVocab")
        self._known = frozenset(self.words)
        self.min_count = _check_min_count(min_count, "WordVocab")
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, 1, 2, 3
        self._itos: tuple[str, ...] = (*self.SPECIALS, *self.words)
        self._stoi: dict[str, int] = {w: i for i, w in enumerate(self._itos) if i >= len(self.SPECIALS)}
        self._stoi[UNK] = self.unk_id

    @property
    def size(self) -> int:
        return len(self._itos)

    @property
    def tokens_per_word(self) -> int:
        return 1

    def token_to_id(self, word: str) -> int:
        """The id of ``word`` (``unk_id`` when it is not in the vocab)."""
        return self._stoi.get(word, self.unk_id)

    def id_to_token(self, token_id: int) -> str:
        """The string of any id, specials included (``"<unk>"`` for ids out of range)."""
        return self._itos[token_id] if 0 <= token_id < len(self._itos) else UNK

    def encode(self, words: Sequence[str]) -> list[int]:
        return [self._stoi.get(w, self.unk_id) for w in words]

    def decode(self, ids: Iterable[int]) -> list[str]:
        out: list[str] = []
        for raw in _plain(ids):
            token = _as_int(raw)
            if token == self.eos_id:
                break
            if token in (self.bos_id, self.pad_id):
                continue
            out.append(self._itos[token] if token is not None and 4 <= token < len(self._itos) else UNK)
        return out

    def _fields(self) -> dict[str, Any]:
        return {
            "pad_id": self.pad_id,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "unk_id": self.unk_id,
            "size": self.size,
            "min_count": self.min_count,
            "words": list(self.words),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "vocab") -> WordVocab:
        """Rebuild from :meth:`to_dict` output, checking every stored id against the layout."""
        _check_kind(data, cls.kind, source)
        vocab = cls(_require_words(data, source), min_count=_check_min_count(data.get("min_count"), source))
        _check_stored(data, vocab, ("pad_id", "bos_id", "eos_id", "unk_id", "size"), source)
        return vocab
