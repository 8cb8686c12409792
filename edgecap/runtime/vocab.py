"""Vocabularies: one token per word (:class:`WordVocab`) or ``d`` radix digits per word (:class:`RadixVocab`).

Both rank words by descending frequency in the training captions, ties broken alphabetically (by code point), so the
same corpus always gives the same ids. Words seen fewer than ``min_count`` times (default 5, the usual COCO
threshold) map to ``<unk>``.

Radix encoding (ACORT, Tan et al., §4.1, Algorithm 1, Eq. 1–3) writes word index ``i`` as ``d`` digits in base ``v``,
so the model's input/output vocabulary shrinks from ~10k words to ``v + 3`` classes. We use the token layout of the
authors' released ACORT code, which its checkpoints follow, rather than the paper's:

==================  ===================================  ==========================================
item                edgecap (= released ACORT code)      paper (Eq. 1–3)
==================  ===================================  ==========================================
digit order         most-significant digit first         least-significant first (``j = 0 … d-1``)
digit ``k``         token ``k + 1`` (tokens ``1 … v``)   token ``k``
padding             PAD = 0; short indices left-padded   no PAD token
                    with digit 0 (token 1)
BOS / EOS           ``v + 1`` / ``v + 2``                ``v`` / ``v + 1``
classes             ``v + 3``                            ``v + 2``
==================  ===================================  ==========================================

``<unk>`` takes the *last* word index ``N - 1`` (``N`` = ``num_words``, unk included), and ``d`` is the number of
base-``v`` digits of ``N - 1``. Indices ``>= N`` are unreachable by :meth:`encode` but a model can still emit them;
:meth:`RadixVocab.decode` maps them (and BOS/EOS/PAD inside a word, or a trailing partial word) to ``"<unk>"``.
A search can avoid them up front with :meth:`RadixVocab.max_digit`.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from edgecap.runtime._io import atomic_write_json
from edgecap.runtime.text import truncate_words

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


# --------------------------------------------------------------------------------------------------------------------
# Word vocabulary


class WordVocab(Vocabulary):
    """One token per word: PAD=0, BOS=1, EOS=2, UNK=3, then the words from id 4 in rank order.

    Args:
        words: in-vocabulary words, most frequent first (no specials, no duplicates).
        min_count: metadata recorded in the saved file.
    """

    kind: ClassVar[str] = "word"
    SPECIALS: ClassVar[tuple[str, ...]] = (PAD, BOS, EOS, UNK)

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


# --------------------------------------------------------------------------------------------------------------------
# Radix vocabulary


def _num_digits(value: int, base: int) -> int:
    """Base-``base`` digits needed to write ``value`` (at least 1)."""
    digits = 1
    while value >= base:
        value //= base
        digits += 1
    return digits


class RadixVocab(Vocabulary):
    """ACORT radix vocabulary (§4.1, Alg. 1, Eq. 1–3) in the released ACORT code's token layout (module docstring).

    Args:
        words: in-vocabulary words, most frequent first; word ``words[i]`` has index ``i`` and ``<unk>`` has
            index ``len(words)``, so ``num_words = len(words) + 1``.
        base: radix base ``v`` (>= 2); ACORT uses 768.
        digits: digits per word ``d``; default (and minimum) is the number of base-``v`` digits of ``num_words - 1``.
            A larger value is allowed for checkpoints trained with a fixed ``d``.
        min_count: metadata recorded in the saved file.

    Example (v = 768, 10k words): word index 0 → tokens ``[1, 1]``; index 800 = 1·768 + 32 → ``[2, 33]``.
    """

    kind: ClassVar[str] = "radix"

    def __init__(
        self,
        words: Sequence[str],
        *,
        base: int = DEFAULT_RADIX_BASE,
        digits: int | None = None,
        min_count: int | None = None,
    ) -> None:
        if isinstance(base, bool) or not isinstance(base, int) or base < 2:
            raise VocabError(f"RadixVocab: base must be an integer >= 2, got {base!r}")
        self.words = _check_words(words, "RadixVocab")
        self._known = frozenset(self.words)
        self.min_count = _check_min_count(min_count, "RadixVocab")
        self.base = base
        self.num_words = len(self.words) + 1
        minimum = _num_digits(self.num_words - 1, base)
        if digits is None:
            digits = minimum
        if isinstance(digits, bool) or not isinstance(digits, int) or digits < minimum:
            raise VocabError(
                f"RadixVocab: digits must be an integer >= {minimum} (digits of {self.num_words - 1} in base {base}), "
                f"got {digits!r}"
            )
        self.digits = digits
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, base + 1, base + 2, None
        self._index: dict[str, int] = {w: i for i, w in enumerate(self.words)}
        self._index[UNK] = self.unk_index
        # Digits of the largest legal index, with and without <unk>, for max_digit().
        self._limit_digits = {True: self.index_to_digits(self.num_words - 1)}
        if self.num_words >= 2:
            self._limit_digits[False] = self.index_to_digits(self.num_words - 2)

    # ---- layout -------------------------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self.base + 3

    @property
    def tokens_per_word(self) -> int:
        return self.digits

    @property
    def unk_index(self) -> int:
        """Word index of ``<unk>``: the last one, ``num_words - 1``."""
        return self.num_words - 1

    def word_index(self, word: str) -> int:
        """Rank index of ``word`` (``unk_index`` when it is not in the vocab)."""
        return self._index.get(word, self.unk_index)

    def index_to_word(self, index: int) -> str:
        """Word of a rank index; ``"<unk>"`` for the unk index and for anything out of range."""
        return self.words[index] if 0 <= index < len(self.words) else UNK

    def index_to_digits(self, index: int) -> list[int]:
        """Eq. (1), most-significant digit first, left-padded with 0 to ``digits`` digits."""
        if not 0 <= index < self.base**self.digits:
            raise ValueError(f"index {index} cannot be written with {self.digits} base-{self.base} digits")
        out = [0] * self.digits
        for j in range(self.digits - 1, -1, -1):
            index, out[j] = divmod(index, self.base)
        return out

    def digits_to_index(self, digits: Sequence[int]) -> int:
        """Inverse of :meth:`index_to_digits` (may exceed ``num_words - 1`` for digit strings no word has)."""
        if len(digits) != self.digits:
            raise ValueError(f"expected {self.digits} digits, got {len(digits)}")
        index = 0
        for digit in digits:
            if not 0 <= digit < self.base:
                raise ValueError(f"digit {digit} is outside [0, {self.base - 1}]")
            index = index * self.base + digit
        return index

    def digit_to_token(self, digit: int) -> int:
        """Digit ``k`` is token ``k + 1``."""
        if not 0 <= digit < self.base:
            raise ValueError(f"digit {digit} is outside [0, {self.base - 1}]")
        return digit + 1

    def token_to_digit(self, token: int) -> int | None:
        """The digit a token carries, or ``None`` for PAD/BOS/EOS and out-of-range ids."""
        return token - 1 if 1 <= token <= self.base else None

    def max_digit(self, position_in_word: int, prefix_digits: Sequence[int], *, allow_unk: bool = True) -> int:
        """Largest digit value legal at ``position_in_word`` given the word's earlier digits.

        "Legal" means some completion of the word still has an index ``<= num_words - 1`` (``<= num_words - 2``,
        i.e. never ``<unk>``, when ``allow_unk`` is false). Every digit from 0 up to the returned value is legal, so a
        search-time constraint (ACORT decodes unconstrained and repairs afterwards; masking at search time is our
        addition) masks tokens ``max_digit + 2 … v`` at this step. Most-significant-first order makes this a
        prefix comparison against the digits of the limit index.

        Args:
            position_in_word: 0-based digit position, ``0 <= position_in_word < digits``.
            prefix_digits: the ``position_in_word`` digits already emitted for this word (values, not tokens).
            allow_unk: whether the ``<unk>`` index counts as legal.

        Returns:
            The largest legal digit, or ``-1`` when no digit is legal (the prefix already exceeds the limit, or
            ``allow_unk`` is false and the vocab has no real words).
        """
        if not 0 <= position_in_word < self.digits:
            raise ValueError(f"position_in_word must be in [0, {self.digits - 1}], got {position_in_word}")
        if len(prefix_digits) != position_in_word:
            raise ValueError(f"prefix_digits has {len(prefix_digits)} digits, expected {position_in_word}")
        limit = self._limit_digits.get(allow_unk)
        if limit is None:
            return -1
        for have, bound in zip(prefix_digits, limit[:position_in_word], strict=True):
            if have < bound:
                return self.base - 1
            if have > bound:
                return -1
        return limit[position_in_word]

    # ---- encode / decode --------------------------------------------------------------------------------------

    def encode(self, words: Sequence[str]) -> list[int]:
        out: list[int] = []
        for word in words:
            out.extend(d + 1 for d in self.index_to_digits(self.word_index(word)))
        return out

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Token ids to words.

        Digit tokens are grouped ``digits`` at a time. Between words PAD and BOS are skipped; inside a word, PAD,
        BOS and out-of-range ids still take their slot (keeping later words aligned) but turn that word into
        ``"<unk>"``, as do indices ``>= num_words - 1`` and a word left incomplete by EOS or the end of ``ids``.
        """
        out: list[str] = []
        index, filled, valid = 0, 0, True
        for raw in _plain(ids):
            token = _as_int(raw)
            if token == self.eos_id:
                break
            if filled == 0 and token in (self.pad_id, self.bos_id):
                continue
            digit = self.token_to_digit(token) if token is not None else None
            if digit is None:
                valid = False
            else:
                index = index * self.base + digit
            filled += 1
            if filled == self.digits:
                out.append(self.index_to_word(index) if valid else UNK)
                index, filled, valid = 0, 0, True
        if filled:
            out.append(UNK)
        return out

    # ---- persistence --------------------------------------------------------------------------------------------

    def _fields(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "digits": self.digits,
            "num_words": self.num_words,
            "pad_id": self.pad_id,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "size": self.size,
            "digit_order": "msd_first",
            "digit_token_offset": 1,
            "min_count": self.min_count,
            "words": list(self.words),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "vocab") -> RadixVocab:
        """Rebuild from :meth:`to_dict` output, checking every stored field against the layout."""
        _check_kind(data, cls.kind, source)
        for key in ("base", "digits"):
            if key not in data:
                raise VocabError(f"{source}: missing field {key!r}")
            if isinstance(data[key], bool) or not isinstance(data[key], int):
                raise VocabError(f"{source}: field {key!r} must be an integer, got {data[key]!r}")
        try:
            vocab = cls(
                _require_words(data, source),
                base=data["base"],
                digits=data["digits"],
                min_count=_check_min_count(data.get("min_count"), source),
            )
        except VocabError as err:
            raise VocabError(f"{source}: {err}") from None
        _check_stored(data, vocab, ("num_words", "pad_id", "bos_id", "eos_id", "size"), source)
        for key, expected in (("digit_order", "msd_first"), ("digit_token_offset", 1)):
            if key in data and data[key] != expected:
                raise VocabError(f"{source}: {key}={data[key]!r} is not supported (edgecap writes {expected!r})")
        return vocab


# --------------------------------------------------------------------------------------------------------------------
# Building and loading


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
