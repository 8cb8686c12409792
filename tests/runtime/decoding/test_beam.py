"""Beam search on scripted step models: exact n-best lists and scores, worked out by hand in the comments."""

from __future__ import annotations

import itertools
import math

import pytest

from edgecap.runtime.decoding import DecodeCfg, beam_search, decode, greedy
from edgecap.runtime.decoding.processors import LengthPenalty
from tests.runtime.decoding.fakes import (
    BOS,
    EOS,
    EOS_FIRST,
    GREEDY_VS_BEAM,
    PAD,
    SHORT_VS_LONG,
    A,
    B,
    C,
    RandomStepModel,
    ScriptedStepModel,
    sequence_logprob,
)

CFG = DecodeCfg(strategy="beam", max_len=10, pad_id=PAD, bos_id=BOS, eos_id=EOS)


def summary(hyps):  # type: ignore[no-untyped-def]
    return [(h.tokens, h.finished) for h in hyps]


def test_beam2_beats_greedy_with_exact_scores() -> None:
    # step 0: A .5, B .4 run; EOS (.1) ranks 3rd, outside the top K=2, so it does not finish.
    # step 1: B C .36 | A EOS .2 | A C .175 | A D .125 -> "A" finishes (rank 1 < K); B C and A C run.
    # step 2: B C EOS .288 | A C EOS .105 | B C C .072 | A C D .07 -> both EOS finish; best two kept:
    #         B C (.288), A (.2). Best running .072 <= .2, so the search stops.
    model = ScriptedStepModel([GREEDY_VS_BEAM])
    [hyps] = beam_search(model, model.inputs(), CFG.replace(beam_size=2, n_best=2))
    assert summary(hyps) == [([B, C], True), ([A], True)]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.288), math.log(0.2)], abs=1e-6)
    assert hyps[0].logprobs == pytest.approx([math.log(0.4), math.log(0.9), math.log(0.8)], abs=1e-6)
    assert model.calls == [1, 2, 2]  # BOS once per image, then K rows
    [[g]] = greedy(model, model.inputs(), CFG)
    assert g.tokens == [A]


def test_beam3_exact_nbest() -> None:
    # step 0: A .5, B .4, EOS .1 (rank 2 < 3 -> "" finishes at .1); the third running beam is dead (-inf).
    # step 1: B C .36 | A EOS .2 | A C .175 | A D .125 | B EOS .04 -> "A" finishes; B C, A C, A D run.
    # step 2: B C EOS .288 | A C EOS .105 | A D EOS .0875 | B C C .072 | ... -> all three EOS finish.
    #         Finished top 3: B C .288, A .2, A C .105; best running .072 <= .105 -> stop.
    model = ScriptedStepModel([GREEDY_VS_BEAM])
    [hyps] = beam_search(model, model.inputs(), CFG.replace(beam_size=3, n_best=3))
    assert summary(hyps) == [([B, C], True), ([A], True), ([A, C], True)]
    assert [h.score for h in hyps] == pytest.approx([math.log(x) for x in (0.288, 0.2, 0.105)], abs=1e-6)
    assert model.calls == [1, 3, 3]


def test_eos_at_step_zero() -> None:
    # step 0: "" finishes at .7, A runs at .3; step 1: A EOS .3 finishes; all running beams are dead -> stop.
    model = ScriptedStepModel([EOS_FIRST])
    [hyps] = beam_search(model, model.inputs(), CFG.replace(beam_size=2, n_best=2))
    assert summary(hyps) == [([], True), ([A], True)]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.7), math.log(0.3)], abs=1e-6)
    assert model.calls == [1, 2]


def test_all_beams_finish_before_max_len() -> None:
    model = ScriptedStepModel([SHORT_VS_LONG])
    beam_search(model, model.inputs(), CFG.replace(beam_size=2, max_len=50))
    assert len(model.calls) == 3


def test_max_len_force_finishes_running_beams() -> None:
    # No EOS ever: step 1 keeps A A .42, B A .28; step 2 (last) keeps A A A .294, B A A .196, cut without EOS.
    model = ScriptedStepModel([{(): {A: 0.6, B: 0.4}}], default={A: 0.7, B: 0.3})
    [hyps] = beam_search(model, model.inputs(), CFG.replace(beam_size=2, n_best=2, max_len=3))
    assert summary(hyps) == [([A, A, A], False), ([B, A, A], False)]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.294), math.log(0.196)], abs=1e-6)
    assert model.calls == [1, 2, 2]


def test_max_len_keeps_eos_finished_hypotheses_that_score_better() -> None:
    model = ScriptedStepModel([GREEDY_VS_BEAM])
    [hyps] = beam_search(model, model.inputs(), CFG.replace(beam_size=2, n_best=2, max_len=2))
    # At the last step (t=1) "A" finishes with EOS (.2); the running B C (.36) and A C (.175) are cut.
    assert summary(hyps) == [([B, C], False), ([A], True)]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.36), math.log(0.2)], abs=1e-6)


@pytest.mark.parametrize(
    ("kind", "expected", "scores"),
    [
        # Raw sums: A .36 (len 2) beats B C .34 (len 3).
        ("none", [[A], [B, C]], [math.log(0.36), math.log(0.34)]),
        # Average (alpha 1): B C log(.34)/3 = -0.360, A C log(.24)/3 = -0.476, A log(.36)/2 = -0.511.
        ("avg", [[B, C], [A, C]], [math.log(0.34) / 3, math.log(0.24) / 3]),
        # GNMT (alpha 1): lp(L) = (5+L)/6; B C log(.34)/(8/6) = -0.809, A log(.36)/(7/6) = -0.876.
        ("wu", [[B, C], [A]], [math.log(0.34) / (8 / 6), math.log(0.36) / (7 / 6)]),
    ],
)
def test_length_penalty_changes_the_ranking(kind: str, expected: list[list[int]], scores: list[float]) -> None:
    model = ScriptedStepModel([SHORT_VS_LONG])
    cfg = CFG.replace(beam_size=2, n_best=2, max_len=4, length_penalty=kind, length_penalty_alpha=1.0)
    [hyps] = beam_search(model, model.inputs(), cfg)
    assert [h.tokens for h in hyps] == expected
    assert [h.score for h in hyps] == pytest.approx(scores, abs=1e-6)
    for h in hyps:  # the penalty changes the score, never the per-token log-probs
        assert h.logprob == pytest.approx(sequence_logprob(model, 0, h.tokens), abs=1e-6)


def test_length_penalty_bound_keeps_searching_while_a_beam_could_win() -> None:
    # avg, alpha 1: after step 2 the finished B C (-0.360) and A C (-0.476) fill K=2, but the running B C C (sum
    # log .06 = -2.81) could still reach -2.81/10 = -0.28 at max_len 10, so a 4th step runs; with max_len 4 the bound
    # is -2.81/4 = -0.70 and the search stops after 3 steps.
    for max_len, steps in ((10, 4), (4, 3)):
        model = ScriptedStepModel([SHORT_VS_LONG])
        cfg = CFG.replace(beam_size=2, max_len=max_len, length_penalty="avg", length_penalty_alpha=1.0)
        beam_search(model, model.inputs(), cfg)
        assert len(model.calls) == steps


def test_length_penalty_upper_bound() -> None:
    lp = LengthPenalty("wu", 1.0)
    assert lp(-1.0, 1) == pytest.approx(-1.0)
    assert lp.upper_bound(-3.0, 2, 10) == pytest.approx(-3.0 / (15 / 6))
    assert LengthPenalty("avg", -1.0).upper_bound(-3.0, 2, 10) == pytest.approx(-3.0 / 0.5)
    assert LengthPenalty().upper_bound(-3.0, 2, 10) == -3.0


@pytest.mark.parametrize("prune", [True, False])
def test_batch_of_three_matches_each_image_alone(prune: bool) -> None:
    scripts = [GREEDY_VS_BEAM, SHORT_VS_LONG, EOS_FIRST]
    model = ScriptedStepModel(scripts)
    cfg = CFG.replace(beam_size=3, n_best=3, prune_finished=prune)
    batched = beam_search(model, model.inputs(), cfg)
    calls = list(model.calls)
    for i in range(len(scripts)):
        alone = beam_search(model, model.inputs([i]), cfg)[0]
        assert summary(batched[i]) == summary(alone)
        assert [h.score for h in batched[i]] == pytest.approx([h.score for h in alone], abs=1e-6)
        for h in batched[i]:
            assert h.score == pytest.approx(sequence_logprob(model, i, h.tokens, EOS if h.finished else None), abs=1e-5)
    if prune:
        # EOS_FIRST is done after step 1 (its beams are all dead), so step 2 runs on 2 images x 3 beams.
        assert calls[:3] == [3, 9, 6]
    else:
        assert set(calls[1:]) == {9}


def test_beam_size_one_equals_greedy() -> None:
    model = RandomStepModel(images=4, vocab_size=9, seed=3)
    cfg = DecodeCfg(strategy="beam", beam_size=1, max_len=7, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    inputs = model.inputs()
    beam = beam_search(model, inputs, cfg)
    gr = greedy(model, inputs, cfg)
    for b, g in zip(beam, gr, strict=True):
        assert summary(b) == summary(g)
        assert b[0].score == pytest.approx(g[0].score, abs=1e-5)


def _brute_force(model: RandomStepModel, image: int, words: list[int], max_len: int) -> list[tuple[float, list[int]]]:
    out = []
    for n in range(max_len + 1):
        for seq in itertools.product(words, repeat=n):
            eos = EOS if n < max_len else None
            out.append((sequence_logprob(model, image, list(seq), eos), list(seq)))
    return sorted(out, key=lambda x: -x[0])


@pytest.mark.parametrize("penalty", ["none", "avg"])
def test_wide_beam_finds_the_exact_nbest(penalty: str) -> None:
    # With K at least the number of live prefixes (3 words, 3 steps -> 9), beam search is exhaustive.
    model = RandomStepModel(images=2, vocab_size=6, seed=11, sharpness=1.0)
    cfg = CFG.replace(beam_size=9, n_best=5, max_len=3, length_penalty=penalty, length_penalty_alpha=1.0)
    results = beam_search(model, model.inputs(), cfg)
    lp = LengthPenalty(penalty, 1.0)
    for image, hyps in enumerate(results):
        oracle = _brute_force(model, image, [3, 4, 5], 3)
        oracle = sorted(
            ((lp(s, len(t) + (len(t) < 3)), t) for s, t in oracle),
            key=lambda x: -x[0],
        )[:5]
        assert [h.tokens for h in hyps] == [t for _, t in oracle]
        assert [h.score for h in hyps] == pytest.approx([s for s, _ in oracle], abs=1e-5)


def test_decode_returns_n_best() -> None:
    model = ScriptedStepModel([GREEDY_VS_BEAM, EOS_FIRST])
    out = decode(model, model.inputs(), CFG.replace(beam_size=3, n_best=2))
    assert [len(h) for h in out] == [2, 2]
    assert out[0][0].tokens == [B, C]


def test_beam_wider_than_vocabulary() -> None:
    # Only A and EOS are ever possible: K=4 leaves dead beams that must never be returned.
    model = ScriptedStepModel([{(): {A: 0.5, EOS: 0.5}}], default={EOS: 1.0})
    [hyps] = beam_search(model, model.inputs(), CFG.replace(beam_size=4, n_best=4))
    assert summary(hyps) == [([], True), ([A], True)]
    assert all(math.isfinite(h.score) for h in hyps)
