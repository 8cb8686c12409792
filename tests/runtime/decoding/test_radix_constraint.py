"""The radix constraint: illegal digit sequences are masked during search, and beam search finds the best legal one."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pytest

from edgecap.runtime.decoding import DecodeCfg, DecodeCfgError, RadixConstraint, RadixSpec, beam_search, greedy, sample
from edgecap.runtime.decoding.processors import StepContext
from edgecap.runtime.vocab import RadixVocab
from tests.runtime.decoding.fakes import RandomStepModel, ScriptedStepModel, sequence_logprob


class FakeRadixVocab:
    """The attributes of ``edgecap.runtime.vocab.RadixVocab`` the constraint reads, with a brute-force ``max_digit``."""

    kind = "radix"

    def __init__(self, base: int, digits: int, num_words: int) -> None:
        self.base, self.digits, self.num_words = base, digits, num_words
        self.pad_id, self.bos_id, self.eos_id = 0, base + 1, base + 2
        self.size = base + 3

    def max_digit(self, position_in_word: int, prefix_digits: Sequence[int], *, allow_unk: bool = True) -> int:
        limit = self.num_words - 1 if allow_unk else self.num_words - 2
        legal = [
            digit
            for digit in range(self.base)
            for rest in itertools.product(range(self.base), repeat=self.digits - position_in_word - 1)
            if _index([*prefix_digits, digit, *rest], self.base) <= limit
        ]
        return max(legal, default=-1)


def _index(digits: Sequence[int], base: int) -> int:
    value = 0
    for d in digits:
        value = value * base + d
    return value


# v=3, d=2, N=7: word indices 0..6 (6 = <unk> = digits (2, 0)); V = v + 3 = 6: PAD 0, digits 1..3, BOS 4, EOS 5.
VOCAB = FakeRadixVocab(base=3, digits=2, num_words=7)
EOS, BOS = VOCAB.eos_id, VOCAB.bos_id


def legal_words(vocab: FakeRadixVocab, allow_unk: bool = True) -> list[list[int]]:
    limit = vocab.num_words - 1 if allow_unk else vocab.num_words - 2
    words = itertools.product(range(vocab.base), repeat=vocab.digits)
    return [[d + 1 for d in w] for w in words if _index(w, vocab.base) <= limit]


def is_legal(tokens: Sequence[int], vocab: FakeRadixVocab, allow_unk: bool = True) -> bool:
    d = vocab.digits
    if len(tokens) % d:
        return False
    words = legal_words(vocab, allow_unk)
    return all(list(tokens[i : i + d]) in words for i in range(0, len(tokens), d))


def cfg_for(vocab: FakeRadixVocab, **kw: object) -> DecodeCfg:
    return DecodeCfg.for_vocab(vocab, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("allow_unk", [True, False])
@pytest.mark.parametrize("vocab", [VOCAB, FakeRadixVocab(4, 3, 21), FakeRadixVocab(5, 1, 5), FakeRadixVocab(2, 3, 8)])
def test_mask_matches_max_digit_at_every_position(vocab: FakeRadixVocab, allow_unk: bool) -> None:
    constraint = RadixConstraint.from_vocab(vocab, allow_unk=allow_unk)
    max_len = 4 * vocab.digits
    for position in range(vocab.digits):
        prefixes = list(itertools.product(range(vocab.base), repeat=position))
        word = [[1] * vocab.digits]  # one complete earlier word, so t = d + position
        history = np.array([word[0] + [p + 1 for p in prefix] for prefix in prefixes], dtype=np.int64)
        t = vocab.digits + position
        allowed = constraint.allowed(StepContext(t, max_len, history), len(prefixes), vocab.size)
        for row, prefix in enumerate(prefixes):
            bound = vocab.max_digit(position, list(prefix), allow_unk=allow_unk)
            digits_ok = allowed[row, 1 : vocab.base + 1].tolist()
            assert digits_ok == [k <= bound for k in range(vocab.base)], (position, prefix)
            assert allowed[row, vocab.eos_id].item() == (position == 0)
            assert not allowed[row, vocab.pad_id] and not allowed[row, vocab.bos_id]


def test_only_eos_when_no_word_fits_before_max_len() -> None:
    constraint = RadixConstraint.from_vocab(VOCAB)
    history = np.array([[1, 2, 3, 1]], dtype=np.int64)
    allowed = constraint.allowed(StepContext(4, 5, history), 1, VOCAB.size)
    assert allowed[0].tolist() == [False, False, False, False, False, True]


def _oracle(model: RandomStepModel, vocab: FakeRadixVocab, max_len: int, allow_unk: bool = True):  # type: ignore[no-untyped-def]
    """Every legal caption: whole words + EOS where another word would still fit, else whole words as they stand (cut
    at max_len, or at the radix cap where only EOS would fit: that step is not run and no EOS is scored)."""
    words = legal_words(vocab, allow_unk)
    out = []
    for n in range(max_len // vocab.digits + 1):
        for seq in itertools.product(words, repeat=n):
            tokens = [t for w in seq for t in w]
            if len(tokens) + vocab.digits <= max_len:
                out.append((sequence_logprob(model, 0, tokens, vocab.eos_id), tokens, True))
            else:
                out.append((sequence_logprob(model, 0, tokens, None), tokens, False))
    return sorted(out, key=lambda x: -x[0])


@pytest.mark.parametrize(("max_len", "allow_unk"), [(5, True), (4, True), (5, False)])
def test_wide_beam_returns_the_best_legal_captions(max_len: int, allow_unk: bool) -> None:
    # K = 64 >= the 49 two-word prefixes, so the search is exhaustive and must equal the oracle.
    model = RandomStepModel(images=1, vocab_size=VOCAB.size, seed=7, sharpness=1.5)
    cfg = cfg_for(VOCAB, suppress_unk=not allow_unk, strategy="beam", beam_size=64, n_best=6, max_len=max_len)
    [hyps] = beam_search(model, model.inputs(), cfg)
    oracle = _oracle(model, VOCAB, max_len, allow_unk)[:6]
    assert [(h.tokens, h.finished) for h in hyps] == [(t, f) for _, t, f in oracle]
    assert [h.score for h in hyps] == pytest.approx([s for s, _, _ in oracle], abs=1e-5)


def test_masked_tokens_never_appear_although_the_model_prefers_them() -> None:
    # The model's favourites are illegal: EOS mid-word, digit 2 after first digit 2 (index 8 > 6), BOS, PAD.
    d1, d2, d3 = 1, 2, 3  # tokens of digits 0, 1, 2
    script = {
        (): {d3: 0.4, EOS: 0.01, BOS: 0.3, d2: 0.29},
        (d3,): {EOS: 0.5, d3: 0.3, d2: 0.15, d1: 0.05},
        (d2,): {EOS: 0.6, d3: 0.4},
    }
    model = ScriptedStepModel([script], vocab_size=VOCAB.size, default={EOS: 0.2, d3: 0.4, 0: 0.3, d2: 0.06, d1: 0.04})
    cfg = cfg_for(VOCAB, strategy="beam", beam_size=3, n_best=3, max_len=6)
    hyps = beam_search(model, model.inputs(), cfg)[0] + greedy(model, model.inputs(), cfg)[0]
    for h in hyps:
        assert is_legal(h.tokens, VOCAB), h.tokens
    # Legal: "" = .01; word (2, 0) = .4 * .05 then EOS .2 = .004; word (1, 2) = .29 * .4 then EOS .2 = .0232 (best).
    assert hyps[0].tokens == [d2, d3]
    assert hyps[0].score == pytest.approx(math.log(0.29 * 0.4 * 0.2), abs=1e-6)
    unconstrained = greedy(model, model.inputs(), cfg.replace(radix=None))[0][0]
    assert unconstrained.tokens == [d3]  # EOS mid-word: what the reference decoder would have to repair


def test_samples_are_always_legal() -> None:
    model = RandomStepModel(images=2, vocab_size=VOCAB.size, seed=3, sharpness=0.3)
    cfg = cfg_for(VOCAB, strategy="sample", num_samples=200, max_len=7, seed=0)
    for row in sample(model, model.inputs(), cfg):
        for h in row:
            assert is_legal(h.tokens, VOCAB), h.tokens


def test_suppress_unk_never_emits_the_unk_index() -> None:
    model = RandomStepModel(images=1, vocab_size=VOCAB.size, seed=1, sharpness=0.3)
    cfg = cfg_for(VOCAB, suppress_unk=True, strategy="sample", num_samples=300, max_len=6, seed=1)
    unk = [t + 1 for t in (2, 0)]
    for h in sample(model, model.inputs(), cfg)[0]:
        words = [h.tokens[i : i + 2] for i in range(0, len(h.tokens), 2)]
        assert unk not in words


def test_from_vocab_checks_layout_and_attributes() -> None:
    class NotRadix:
        pad_id, bos_id, eos_id = 0, 1, 2

    with pytest.raises(DecodeCfgError, match="missing"):
        RadixConstraint.from_vocab(NotRadix())
    shifted = FakeRadixVocab(3, 2, 7)
    shifted.bos_id, shifted.eos_id = 1, 2
    with pytest.raises(DecodeCfgError, match="expected"):
        RadixConstraint.from_vocab(shifted)


def test_vocab_size_mismatch_is_reported() -> None:
    constraint = RadixConstraint(RadixSpec(3, 2, 7))
    with pytest.raises(DecodeCfgError, match="output classes"):
        constraint(np.zeros((1, 10), dtype=np.float32), StepContext(0, 5, np.empty((1, 0), dtype=np.int64)))


def test_real_radix_vocab_agrees_with_the_constraint() -> None:
    words = [f"w{i}" for i in range(20)]
    vocab = RadixVocab(words, base=4)  # N = 21 -> 3 digits in base 4
    cfg = DecodeCfg.for_vocab(vocab, strategy="beam", beam_size=4, max_len=9)
    assert cfg.radix == RadixSpec(4, vocab.digits, 21)
    test_mask_matches_max_digit_at_every_position(vocab, allow_unk=True)  # type: ignore[arg-type]
    test_mask_matches_max_digit_at_every_position(vocab, allow_unk=False)  # type: ignore[arg-type]
    model = RandomStepModel(images=2, vocab_size=vocab.size, seed=4, sharpness=0.5)
    for hyps in beam_search(model, model.inputs(), cfg):
        decoded = vocab.decode(hyps[0].tokens)
        assert len(decoded) == len(hyps[0].tokens) // vocab.digits
        assert all(w in words or w == "<unk>" for w in decoded)
