"""Search-time masking of illegal radix digit sequences (ACORT's radix tokens).

The ACORT reference decodes without restriction and repairs illegal output afterwards: EOS or BOS mid-word and digit
pairs whose index exceeds the vocabulary all become ``<unk>`` (jiahuei/sparse-image-captioning).
Masking them while searching instead means every beam slot holds a decodable caption, and the search returns the
best *legal* sequence under the model.

Layout (the released ACORT code's, not the paper's Eq. 1–3 order): PAD=0, digit k → token k+1 (1 … v), BOS=v+1, EOS=v+2,
d digits per word, most-significant first; word indices 0 … N−1 with ``<unk>`` = N−1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgecap.runtime.decoding.config import DecodeCfgError, RadixSpec
from edgecap.runtime.decoding.logits import NEG_INF, StepContext


class RadixConstraint:
    """Mask tokens that cannot continue a legal radix caption.

    At step t every row is at digit position p = t mod d of its current word (all rows of a search share t).

    - PAD and BOS are never legal.
    - EOS is legal only at a word boundary (p = 0).
    - A digit is legal only if some completion of the word keeps its index <= ``limit`` (N−1, or N−2 when ``<unk>``
      is suppressed): with the word's earlier digits forming the prefix value P, the largest legal digit is the
      limit's digit at p when P equals the limit's prefix, else v−1.
    - At a word boundary with fewer than d steps left before ``max_len``, no word can be completed, so only EOS is
      legal (a cut caption never ends mid-word). The searches do not run that step (the radix cap,
      :meth:`~edgecap.runtime.decoding.processors.ProcessorPlan.only_token`): hypotheses still going end there as
      they stand, unfinished and without an EOS score, as the official search stops at ``seq_length``.

    The legal set therefore takes few forms, each precomputed once as a (V,) mask: at a word boundary (p = 0, where
    P = 0) it is the same for every row (:meth:`step_mask`, folded into the search's one masked copy); inside a word
    a row's P is below, equal to or above the limit's prefix, and a per-position (3, V) table indexed by that
    comparison gives every row's mask with one gather.
    """

    def __init__(self, spec: RadixSpec) -> None:
        self.spec = spec
        v, d = spec.base, spec.digits
        self.pad_id, self.bos_id, self.eos_id = 0, v + 1, v + 2
        self.vocab_size = v + 3
        self.limit = spec.num_words - 1 if spec.allow_unk else spec.num_words - 2
        limit = max(self.limit, 0)
        # limit_prefix[p]: value of the limit's first p digits; limit_digit[p]: its digit at position p.
        self.limit_prefix = [limit // v ** (d - p) for p in range(d)]
        self.limit_digit = [(limit // v ** (d - 1 - p)) % v for p in range(d)]
        # At a boundary the prefix is empty (P = 0 = the limit's empty prefix), so the limit's first digit bounds.
        first = self.limit_digit[0] if self.limit >= 0 else -1
        self._boundary = {final: self._banned(-1 if final else first, eos=True) for final in (False, True)}
        self._tables: list[tuple[np.ndarray, np.ndarray, np.ndarray | None] | None] = [None] * d

    @classmethod
    def from_spec(cls, spec: RadixSpec) -> RadixConstraint:
        return cls(spec)

    @classmethod
    def from_vocab(cls, vocab: Any, *, allow_unk: bool = True) -> RadixConstraint:
        """Build from a radix vocabulary (duck-typed: ``base``, ``digits``, ``num_words``, ``pad_id``, ``bos_id``,
        ``eos_id``), checking that its token ids follow the layout this constraint assumes."""
        missing = [a for a in ("base", "digits", "num_words", "pad_id", "bos_id", "eos_id") if not hasattr(vocab, a)]
        if missing:
            raise DecodeCfgError(f"{type(vocab).__name__} is not a radix vocabulary: missing {missing}")
        spec = RadixSpec(int(vocab.base), int(vocab.digits), int(vocab.num_words), allow_unk=allow_unk)
        got = (vocab.pad_id, vocab.bos_id, vocab.eos_id)
        want = (0, spec.base + 1, spec.base + 2)
        if tuple(got) != want:
            raise DecodeCfgError(f"radix vocabulary has (pad, bos, eos) = {got}, expected {want} for base {spec.base}")
        return cls(spec)

    def _banned(self, max_digit: int, *, eos: bool) -> np.ndarray:
        """(V,) bool read-only mask of the illegal tokens when digits 0 … ``max_digit`` (none for −1) and, if
        ``eos``, EOS are legal."""
        banned = np.ones(self.vocab_size, dtype=bool)
        banned[self.eos_id] = not eos
        banned[1 : max_digit + 2] = False  # digits 0 … max_digit are tokens 1 … max_digit + 1
        banned.setflags(write=False)
        return banned

    def _check_vocab(self, vocab_size: int) -> None:
        if vocab_size != self.vocab_size:
            raise DecodeCfgError(
                f"radix base {self.spec.base} implies {self.vocab_size} output classes, the model has {vocab_size}"
            )

    def step_mask(self, step: int, max_len: int, vocab_size: int) -> np.ndarray | None:
        """The tokens banned in every row at a word boundary (EOS legal; only EOS when no word fits any more);
        None inside a word, where the ban depends on the row's earlier digits."""
        self._check_vocab(vocab_size)
        if step % self.spec.digits:
            return None
        return self._boundary[step + self.spec.digits > max_len]

    def _table(self, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """For a position inside a word: the (3, V) banned masks for a prefix below / equal to / above the limit's,
        the bucket boundaries of the rows' weighted token sums that pick among them, and the weights (None: p = 1)."""
        tables = self._tables
        entry = tables[position]
        if entry is None:
            v, p, limit_prefix = self.spec.base, position, self.limit_prefix[position]
            ok = self.limit >= 0
            rows = [
                self._banned(v - 1 if ok else -1, eos=False),
                self._banned(self.limit_digit[p] if ok else -1, eos=False),
                self._banned(-1, eos=False),
            ]
            weights = [v ** (p - 1 - j) for j in range(p)]
            offset = sum(weights)  # tokens are digits + 1: sum((tok - 1) * w) = sum(tok * w) - offset
            bounds = np.array([limit_prefix + offset, limit_prefix + offset + 1], dtype=np.int64)
            weight_a = np.array(weights, dtype=np.int64) if p > 1 else None
            entry = tables[position] = (np.stack(rows), bounds, weight_a)
        return entry

    def banned(self, ctx: StepContext, rows: int, vocab_size: int) -> np.ndarray:
        """(N, V) bool: which tokens each row may *not* generate at step ``ctx.step`` (read-only: at a word boundary a
        broadcast view of a shared mask)."""
        self._check_vocab(vocab_size)
        t, d = ctx.step, self.spec.digits
        position = t % d
        if position == 0:
            return np.broadcast_to(self._boundary[t + d > ctx.max_len], (rows, vocab_size))
        table, bounds, weights = self._table(position)
        digits = np.asarray(ctx.tokens[:, t - position : t], dtype=np.int64)
        value = digits[:, 0] if weights is None else digits @ weights
        # 0: prefix below the limit's (all digits), 1: equal (digits up to the limit's), 2: above (none).
        return table[np.searchsorted(bounds, value, side="right")]

    def allowed(self, ctx: StepContext, rows: int, vocab_size: int) -> np.ndarray:
        """(N, V) bool: which tokens each row may generate at step ``ctx.step``."""
        return ~self.banned(ctx, rows, vocab_size)

    def __call__(self, logprobs: np.ndarray, ctx: StepContext) -> np.ndarray:
        banned = self.banned(ctx, logprobs.shape[0], logprobs.shape[1])
        np.copyto(logprobs, NEG_INF, where=banned)
        return logprobs

    def __repr__(self) -> str:
        s = self.spec
        return f"RadixConstraint(base={s.base}, digits={s.digits}, num_words={s.num_words}, allow_unk={s.allow_unk})"
