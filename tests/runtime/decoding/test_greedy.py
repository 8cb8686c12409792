"""Greedy decoding on scripted step models: exact tokens, scores, EOS handling and batching."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgecap.runtime.decoding import DecodeCfg, DecodeInputError, decode, greedy, stack_hypotheses
from edgecap.runtime.decoding.processors import NoRepeatNGram, StepContext
from tests.runtime.decoding.fakes import (
    EOS,
    EOS_FIRST,
    GREEDY_VS_BEAM,
    PAD,
    SHORT_VS_LONG,
    A,
    B,
    C,
    D,
    ScriptedStepModel,
    sequence_logprob,
)

CFG = DecodeCfg(strategy="greedy", max_len=10, pad_id=PAD, bos_id=1, eos_id=EOS)


def test_greedy_takes_the_most_likely_token_each_step() -> None:
    model = ScriptedStepModel([GREEDY_VS_BEAM])
    [[hyp]] = greedy(model, model.inputs(), CFG)
    assert hyp.tokens == [A]
    assert hyp.finished
    assert hyp.score == pytest.approx(math.log(0.5 * 0.4), abs=1e-6)
    assert hyp.logprobs == pytest.approx([math.log(0.5), math.log(0.4)], abs=1e-6)
    assert model.calls == [1, 1]  # stops as soon as the only row has ended


def test_eos_at_step_zero_gives_an_empty_caption() -> None:
    model = ScriptedStepModel([EOS_FIRST])
    [[hyp]] = greedy(model, model.inputs(), CFG)
    assert hyp.tokens == [] and hyp.finished
    assert hyp.score == pytest.approx(math.log(0.7), abs=1e-6)


def test_min_len_delays_eos() -> None:
    model = ScriptedStepModel([GREEDY_VS_BEAM])
    [[hyp]] = greedy(model, model.inputs(), CFG.replace(min_len=2))
    assert hyp.tokens == [A, C]
    assert hyp.score == pytest.approx(math.log(0.5 * 0.35 * 0.6), abs=1e-6)


def test_max_len_cuts_without_eos() -> None:
    model = ScriptedStepModel([{(): {A: 0.6, B: 0.4}}], default={A: 0.7, B: 0.3})
    [[hyp]] = greedy(model, model.inputs(), CFG.replace(max_len=3))
    assert hyp.tokens == [A, A, A] and not hyp.finished
    assert hyp.score == pytest.approx(math.log(0.6 * 0.7 * 0.7), abs=1e-6)
    assert model.calls == [1, 1, 1]


@pytest.mark.parametrize("prune", [True, False])
def test_batched_rows_match_single_rows(prune: bool) -> None:
    scripts = [GREEDY_VS_BEAM, SHORT_VS_LONG, EOS_FIRST]
    model = ScriptedStepModel(scripts)
    batched = greedy(model, model.inputs(), CFG.replace(prune_finished=prune))
    for i in range(len(scripts)):
        alone = greedy(model, model.inputs([i]), CFG)
        assert batched[i] == alone[0]
        assert batched[i][0].score == pytest.approx(sequence_logprob(model, i, batched[i][0].tokens), abs=1e-5)
    model.calls.clear()
    greedy(model, model.inputs(), CFG.replace(prune_finished=prune))
    # EOS_FIRST ends at step 0, GREEDY_VS_BEAM at step 1, SHORT_VS_LONG (A, EOS) at step 1.
    assert model.calls == ([3, 2] if prune else [3, 3])


def test_finished_rows_are_fed_pad_when_not_pruned() -> None:
    model = ScriptedStepModel([EOS_FIRST, {(): {A: 1.0}, (A,): {B: 1.0}}])
    greedy(model, model.inputs(), CFG.replace(prune_finished=False, max_len=3))
    assert model.calls == [2, 2, 2]
    assert model.fed == [[1, 1], [PAD, A], [PAD, B]]


def test_no_repeat_ngram_blocks_repeats() -> None:
    script = {(): {A: 0.9, EOS: 0.1}, (A,): {A: 0.8, B: 0.15, EOS: 0.05}, (A, B): {A: 0.6, EOS: 0.4}}
    model = ScriptedStepModel([script], default={A: 0.5, B: 0.5})
    [[plain]] = greedy(model, model.inputs(), CFG.replace(max_len=3))
    assert plain.tokens == [A, A, A]
    [[blocked]] = greedy(model, model.inputs(), CFG.replace(max_len=3, no_repeat_ngram=1))
    assert blocked.tokens == [A, B] and blocked.finished


def test_no_repeat_ngram_processor_bans_the_continuation_of_a_seen_bigram() -> None:
    lp = np.zeros((2, 7), dtype=np.float32)
    history = np.array([[A, B, D, A], [A, B, C, D]], dtype=np.int64)
    out = NoRepeatNGram(2)(lp, StepContext(4, 10, history))
    assert np.isinf(out[0, B]) and np.isinf(out[0]).sum() == 1  # "A B" seen, row ends with A
    assert np.isinf(out[1]).sum() == 0  # "D" never continued before


def test_decode_dispatches_on_strategy() -> None:
    model = ScriptedStepModel([GREEDY_VS_BEAM])
    assert decode(model, model.inputs(), CFG) == greedy(model, model.inputs(), CFG)


def test_step_model_returning_wrong_shape_is_a_clear_error() -> None:
    class Broken(ScriptedStepModel):
        def step(self, tokens, state):  # type: ignore[no-untyped-def]
            lp, state = super().step(tokens, state)
            return lp[:, None, :], state

    model = Broken([GREEDY_VS_BEAM])
    with pytest.raises(DecodeInputError, match="expected"):
        greedy(model, model.inputs(), CFG)


def test_stack_hypotheses_appends_eos_to_finished_only() -> None:
    model = ScriptedStepModel([GREEDY_VS_BEAM, {(): {A: 1.0}}], default={B: 1.0})
    hyps = [h for row in greedy(model, model.inputs(), CFG.replace(max_len=2)) for h in row]
    tokens, lengths = stack_hypotheses(hyps, pad_id=PAD, eos_id=EOS)
    assert isinstance(tokens, np.ndarray) and tokens.dtype == np.int64 and lengths.dtype == np.int64
    assert tokens.tolist() == [[A, EOS], [A, B]]
    assert lengths.tolist() == [2, 2]
