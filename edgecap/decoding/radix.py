"""Search-time masking of illegal radix digit sequences (ACORT's radix tokens).

The ACORT reference decodes without restriction and repairs illegal output afterwards: EOS or BOS mid-word and digit
pairs whose index exceeds the vocabulary all become ``<unk>`` (reference-code notes §1.1, "Invalid combinations").
Masking them while searching instead means every beam slot holds a decodable caption, and the search returns the
best *legal* sequence under the model.

Layout (reference code, not the paper's Eq. 1–3 order): PAD=0, digit k → token k+1 (1 … v), BOS=v+1, EOS=v+2,
d digits per word, most-significant first; word indices 0 … N−1 with ``<unk>`` = N−1.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from edgecap.decoding.config import DecodeCfgError, RadixSpec
from edgecap.decoding.processors import NEG_INF, StepContext


class RadixConstraint:
    """Mask tokens that cannot continue a legal radix caption.

    At step t every row is at digit position p = t mod d of its current word (all rows of a search share t).

    - PAD and BOS are never legal.
    - EOS is legal only at a word boundary (p = 0).
    - A digit is legal only if some completion of the word keeps its index <= ``limit`` (N−1, or N−2 when ``<unk>``
      is suppressed): with the word's earlier digits forming the prefix value P, the largest legal digit is the
      limit's digit at p when P equals the limit's prefix, else v−1.
    - At a word boundary with fewer than d steps left before ``max_len``, no word can be completed, so only EOS is
      legal (a cut caption never ends mid-word).

    Vectorised over the (N, V) batch: the prefix value of each row comes from its last p tokens.
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
        self._digit_values: dict[torch.device, Tensor] = {}

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

    def max_digit(self, prefix_value: Tensor, position: int) -> Tensor:
        """Largest legal digit at ``position`` for each row's word prefix value (N,) → (N,) long; −1 = none."""
        if self.limit < 0:
            return torch.full_like(prefix_value, -1)
        free = torch.full_like(prefix_value, self.spec.base - 1)
        bounded = torch.full_like(prefix_value, self.limit_digit[position])
        out = torch.where(prefix_value == self.limit_prefix[position], bounded, free)
        return out.masked_fill(prefix_value > self.limit_prefix[position], -1)

    def allowed(self, ctx: StepContext, rows: int, vocab_size: int, device: torch.device) -> Tensor:
        """(N, V) bool: which tokens each row may generate at step ``ctx.step``."""
        if vocab_size != self.vocab_size:
            raise DecodeCfgError(
                f"radix base {self.spec.base} implies {self.vocab_size} output classes, the model has {vocab_size}"
            )
        v, d, t = self.spec.base, self.spec.digits, ctx.step
        position = t % d
        allowed = torch.zeros(rows, vocab_size, dtype=torch.bool, device=device)
        if position == 0:
            allowed[:, self.eos_id] = True
            if t + d > ctx.max_len:  # no room left to complete another word
                return allowed
        prefix = torch.zeros(rows, dtype=torch.long, device=device)
        if position:
            digits = ctx.tokens[:, t - position : t].to(device=device, dtype=torch.long) - 1
            for j in range(position):
                prefix = prefix * v + digits[:, j]
        values = self._digit_values.get(device)
        if values is None:
            values = self._digit_values[device] = torch.arange(v, device=device)
        allowed[:, 1 : v + 1] = values[None, :] <= self.max_digit(prefix, position)[:, None]
        return allowed

    def __call__(self, logprobs: Tensor, ctx: StepContext) -> Tensor:
        allowed = self.allowed(ctx, logprobs.shape[0], logprobs.shape[1], logprobs.device)
        return logprobs.masked_fill_(~allowed, NEG_INF)

    def __repr__(self) -> str:
        s = self.spec
        return f"RadixConstraint(base={s.base}, digits={s.digits}, num_words={s.num_words}, allow_unk={s.allow_unk})"
