"""Mask-predict-update (LaBERT §3.2) against a scripted fake refine model: exact tokens fed and chosen at every
iteration, the EOS decay (Eq. 5), both confidence update rules (Eq. 7 and the original), cutting at EOS."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from edgecap.runtime.decoding import DecodeCfg, DecodeCfgError, decode
from edgecap.runtime.decoding.arrays import to_numpy
from edgecap.runtime.decoding.mask_predict import eos_decay_bias, mask_counts
from tests.runtime.decoding.fakes import as_backend, check_index

PAD, BOS, EOS = 0, 1, 2
V = 6  # PAD, BOS, EOS, words 3..5
MASK = 6
M = MASK


def row(token: int, p: float) -> list[float]:
    """A distribution with probability ``p`` on ``token`` and the rest spread evenly."""
    rest = (1.0 - p) / (V - 1)
    return [p if t == token else rest for t in range(V)]


class ScriptedRefine:
    """Returns the next scripted (L, V) probability table at every ``refine`` call and records what it was fed
    (state and log-probs in the array type of ``fakes.BACKEND``)."""

    length_levels = ((1, 2), (3, 4))
    refine_steps = (2, 3)
    eos_decay = (1.0, 1.0)
    mask_id = MASK

    def __init__(self, script: Sequence[Sequence[list[float]]]) -> None:
        self.script = list(script)
        self.fed: list[list[int]] = []
        self.levels: list[list[int]] = []

    def encode(self, inputs: Mapping[str, object]) -> dict[str, object]:
        return {"visual": as_backend(np.zeros((to_numpy(inputs["features"]).shape[0], 1), dtype=np.float32))}

    def refine(self, tokens: np.ndarray, length_level: np.ndarray, state: dict) -> object:
        assert type(tokens) is np.ndarray and tokens.dtype == np.int64 and tokens.ndim == 2
        check_index(length_level, "length_level")
        self.fed.append(tokens[0].tolist())
        self.levels.append(length_level.tolist())
        table = np.log(np.asarray(self.script[len(self.fed) - 1], dtype=np.float32))
        return as_backend(np.ascontiguousarray(np.broadcast_to(table[None], (tokens.shape[0], *table.shape))))


INPUTS = {"features": np.zeros((1, 3, 2), dtype=np.float32)}
CALL1 = [row(3, 0.9), row(4, 0.5), row(5, 0.6), row(EOS, 0.7)]
CALL2 = [row(3, 0.3), row(5, 0.8), row(5, 0.9), row(EOS, 0.9)]
CALL3 = [row(4, 0.7), row(4, 0.7), row(3, 0.7), row(EOS, 0.7)]


def cfg(**kw: object) -> DecodeCfg:
    return DecodeCfg(**{"strategy": "mask_predict", "pad_id": PAD, "bos_id": BOS, "eos_id": EOS, **kw})


def test_global_update_rule_tokens_per_iteration() -> None:
    fake = ScriptedRefine([CALL1, CALL2, CALL3])
    (hyps,) = decode(fake, INPUTS, cfg(length_level=2, refine_steps=3))
    # t=1 all masked; t=2 re-masks the 1 lowest confidence (pos 1: 0.5); global update makes pos 0 the lowest:
    # c = [(0.9+0.3)/2, 0.8, (0.6+0.9)/2, (0.7+0.9)/2] = [0.6, 0.8, 0.75, 0.8].
    assert fake.fed == [[M, M, M, M], [3, M, 5, EOS], [M, 5, 5, EOS]]
    assert fake.levels == [[2]] * 3
    assert hyps[0].tokens == [4, 5, 5] and hyps[0].finished
    # each kept token's log-prob from when it was last predicted, then EOS's (from step 1: never re-masked)
    assert hyps[0].logprobs == pytest.approx([math.log(0.7), math.log(0.8), math.log(0.6), math.log(0.7)], abs=1e-6)
    assert hyps[0].score == pytest.approx(sum(hyps[0].logprobs))


def test_original_update_rule_keeps_unmasked_confidences() -> None:
    fake = ScriptedRefine([CALL1, CALL2, CALL3])
    (hyps,) = decode(fake, INPUTS, cfg(length_level=2, refine_steps=3, update_rule="original"))
    # only the masked position's confidence changes: c = [0.9, 0.8, 0.6, 0.7] -> pos 2 is re-masked at t=3
    assert fake.fed == [[M, M, M, M], [3, M, 5, EOS], [3, 5, M, EOS]]
    assert hyps[0].tokens == [3, 5, 3]


def test_eos_decay_after_the_lower_bound() -> None:
    # pos 0 (i=1 < L_low=3) keeps its EOS untouched; pos 2 (i=3): p(EOS)=0.4 decays by γ^(4-3) below word 3's 0.35.
    table = [row(4, 0.5), row(5, 0.5), row(EOS, 0.4), row(EOS, 0.5)]
    table[2][3] = 0.35
    plain = decode(ScriptedRefine([table]), INPUTS, cfg(length_level=2, refine_steps=1, eos_decay=1.0))
    decayed = decode(ScriptedRefine([table]), INPUTS, cfg(length_level=2, refine_steps=1, eos_decay=0.5))
    assert plain[0][0].tokens == [4, 5]
    assert decayed[0][0].tokens == [4, 5, 3]
    assert eos_decay_bias(3, 4, 0.5).tolist() == pytest.approx([0.0, 0.0, math.log(0.5), 0.0])
    assert eos_decay_bias(1, 25, 0.88)[0].item() == pytest.approx(24 * math.log(0.88))  # γ^(L_high − i) at i=1


def test_defaults_come_from_the_model_and_every_step_is_one_call() -> None:
    fake = ScriptedRefine([CALL1, CALL2, CALL3])
    decode(fake, INPUTS, cfg(length_level=2))  # refine_steps=None -> the model's T=3 for level 2
    assert len(fake.fed) == 3


def test_no_eos_returns_the_whole_level_unfinished_and_special_tokens_are_never_chosen() -> None:
    table = [row(PAD, 0.5), row(BOS, 0.5), row(3, 0.9), row(4, 0.9)]
    table[0][5] = table[1][4] = 0.2  # the best non-special tokens behind PAD / BOS
    (hyps,) = decode(ScriptedRefine([table]), INPUTS, cfg(length_level=2, refine_steps=1))
    assert not hyps[0].finished and len(hyps[0].tokens) == 4
    assert hyps[0].tokens == [5, 4, 3, 4]


def test_linear_mask_schedule() -> None:
    # n_t = max(1, floor(L_high (T - t) / T)) for t = 2..T (the paper's schedule, at least one re-mask per pass)
    assert mask_counts(25, 10) == [20, 17, 15, 12, 10, 7, 5, 2, 1]
    assert mask_counts(9, 1) == []


@pytest.mark.parametrize("level", [None, 0, 3])
def test_length_level_must_be_valid(level: int | None) -> None:
    with pytest.raises(DecodeCfgError, match="length_level"):
        decode(ScriptedRefine([CALL1]), INPUTS, cfg(length_level=level))


def test_bad_update_rule_and_decay_are_rejected() -> None:
    with pytest.raises(DecodeCfgError, match="update_rule"):
        cfg(length_level=1, update_rule="local")
    with pytest.raises(DecodeCfgError, match="eos_decay"):
        cfg(length_level=1, eos_decay=1.5)
