"""The radix length cap: ACORT's official search stops at ``seq_length`` (26 tokens, 13 two-digit words) and takes its
unfinished beams as they stand, with their summed log-probs. edgecap decodes ``max_words · 2 + 1`` tokens, so after
the last whole word only EOS is legal; that step is not run and no forced EOS is scored, else an unfinished caption
loses to a short or empty one whenever EOS is unlikely after the last word.

Layout: radix base 4, 2 digits, 13 words (PAD 0, digits 1-4, BOS 5, EOS 6), 3 words at most: ``max_len`` 7.
"""

from __future__ import annotations

import math

import pytest

from edgecap.runtime.decoding import DecodeCfg, RadixSpec, beam_search, decode, greedy, sample
from edgecap.runtime.decoding import beam as beam_module
from tests.runtime.decoding.fakes import ScriptedStepModel

PAD, BOS, EOS = 0, 5, 6
CFG = DecodeCfg(strategy="beam", beam_size=3, max_len=7, pad_id=PAD, bos_id=BOS, eos_id=EOS, radix=RadixSpec(4, 2, 13))
#: EOS never possible: digit 0 (token 1) is the likeliest everywhere.
NO_EOS = {1: 0.6, 2: 0.3, 3: 0.1}


@pytest.fixture(params=["per-image", "vectorised"])
def search_form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both forms of the beam search (``beam.SMALL_BATCH`` picks one)."""
    monkeypatch.setattr(beam_module, "SMALL_BATCH", 10**9 if request.param == "per-image" else 0)
    return str(request.param)


def test_unreachable_eos_returns_the_full_length_caption(search_form: str) -> None:
    # Every step prefers digit 0: the best caption is 3 words (6 digits) with no EOS anywhere, score 6·log .6.
    model = ScriptedStepModel([{}, {}], vocab_size=7, default=NO_EOS)
    results = beam_search(model, model.inputs(), CFG.replace(n_best=2))
    for hyps in results:
        assert [(h.tokens, h.finished) for h in hyps] == [([1] * 6, False), ([1] * 5 + [2], False)]
        assert hyps[0].score == pytest.approx(6 * math.log(0.6), abs=1e-5)
        assert hyps[0].logprobs == pytest.approx([math.log(0.6)] * 6, abs=1e-6)
    assert len(model.calls) == 6  # the cap step (only EOS legal) is not run


def test_an_unlikely_eos_after_the_last_word_does_not_lose_to_the_empty_caption(search_form: str) -> None:
    # The empty caption finishes at step 0 with .15 (log -1.9); the 3-word caption sums to log .85 + 5·log .99 = -0.21.
    # Scoring a forced EOS of 1e-9 (-20.7) at the 7th token would rank the empty caption first.
    model = ScriptedStepModel([{(): {1: 0.85, EOS: 0.15}}], vocab_size=7, default={1: 0.99, 2: 0.01, EOS: 1e-9})
    [hyps] = beam_search(model, model.inputs(), CFG.replace(n_best=2))
    assert [(h.tokens, h.finished) for h in hyps][0] == ([1] * 6, False)
    assert hyps[0].score == pytest.approx(math.log(0.85) + 5 * math.log(0.99), abs=1e-5)
    assert ([], True) in [(h.tokens, h.finished) for h in hyps]


def test_a_likely_eos_after_the_last_word_is_the_same_caption_without_the_eos(search_form: str) -> None:
    model = ScriptedStepModel([{}], vocab_size=7, default={1: 0.9, 2: 0.1})
    [[best]] = beam_search(model, model.inputs(), CFG)
    assert (best.tokens, best.finished) == ([1] * 6, False)
    assert best.score == pytest.approx(6 * math.log(0.9), abs=1e-5)


def test_even_max_len_has_no_cap_step() -> None:
    # max_len 6 ends on a word's last digit: the search force-finishes there as before (no step where only EOS fits).
    model = ScriptedStepModel([{}], vocab_size=7, default=NO_EOS)
    [[best]] = beam_search(model, model.inputs(), CFG.replace(max_len=6))
    assert (best.tokens, best.finished) == ([1] * 6, False)
    assert len(model.calls) == 6


@pytest.mark.parametrize("strategy", ["greedy", "sample"])
def test_greedy_and_sampling_stop_at_the_cap_as_the_official_sample(strategy: str) -> None:
    # The official _sample runs seq_length steps and appends no EOS: rows still going end unfinished, and no banned
    # token is drawn at a step where EOS (impossible here) would be the only legal one.
    model = ScriptedStepModel([{}], vocab_size=7, default={1: 1.0})
    cfg = CFG.replace(strategy=strategy, beam_size=1, seed=0)
    fn = greedy if strategy == "greedy" else sample
    [[hyp]] = fn(model, model.inputs(), cfg)
    assert (hyp.tokens, hyp.finished, hyp.score) == ([1] * 6, False, 0.0)
    assert len(model.calls) == 6


def test_word_vocabularies_keep_their_last_step() -> None:
    # No radix: the last step may still be a word, and the official cap (seq_length tokens, EOS counted) is met by
    # max_len itself, as before.
    model = ScriptedStepModel([{}], vocab_size=7, default={3: 0.7, 4: 0.3})
    cfg = DecodeCfg(strategy="beam", beam_size=2, max_len=3, pad_id=0, bos_id=1, eos_id=2)
    [[best]] = decode(model, model.inputs(), cfg)
    assert (best.tokens, best.finished) == ([3, 3, 3], False)
