"""The ACORT radix vocabulary (:class:`RadixVocab`): ``d`` digit tokens per word; :mod:`edgecap.runtime.vocab`
re-exports it.

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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from edgecap.runtime.vocab_base import (
    DEFAULT_RADIX_BASE,
    UNK,
    VocabError,
    Vocabulary,
    _as_int,
    _check_kind,
    _check_min_count,
    _check_stored,
    _check_words,
    _plain,
    _require_words,
)

__all__ = ["RadixVocab"]


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
