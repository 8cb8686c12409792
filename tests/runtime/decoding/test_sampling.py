"""Multinomial sampling: seeded determinism, empirical frequencies, temperature and top-k."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from edgecap.runtime.decoding import DecodeCfg, DecodeCfgError, decode, sample
from tests.runtime.decoding.fakes import BOS, EOS, PAD, A, B, C, D, RandomStepModel, ScriptedStepModel, sequence_logprob

CFG = DecodeCfg(strategy="sample", max_len=6, pad_id=PAD, bos_id=BOS, eos_id=EOS, seed=1234)
FIRST = {(): {A: 0.5, B: 0.3, C: 0.2}}  # then EOS (the default) with probability 1


def first_token_frequencies(cfg: DecodeCfg, n: int = 2000) -> dict[int, float]:
    model = ScriptedStepModel([FIRST])
    [samples] = sample(model, model.inputs(), cfg.replace(num_samples=n))
    assert len(samples) == n
    counts = Counter(h.tokens[0] for h in samples)
    return {tok: counts[tok] / n for tok in (A, B, C)}


def test_same_seed_same_samples_and_different_seed_differs() -> None:
    model = RandomStepModel(images=2, vocab_size=8, seed=5, sharpness=0.5)
    cfg = CFG.replace(num_samples=4)
    first = sample(model, model.inputs(), cfg)
    again = sample(model, model.inputs(), cfg)
    other = sample(model, model.inputs(), cfg.replace(seed=99))
    assert [[h.tokens for h in row] for row in first] == [[h.tokens for h in row] for row in again]
    assert [[h.tokens for h in row] for row in first] != [[h.tokens for h in row] for row in other]


def test_empirical_frequencies_match_the_distribution() -> None:
    # 2000 draws: the standard error of a frequency near 0.5 is 0.011, so 0.04 is about 3.5 sigma.
    freqs = first_token_frequencies(CFG)
    assert freqs == pytest.approx({A: 0.5, B: 0.3, C: 0.2}, abs=0.04)


def test_temperature_flattens_the_distribution() -> None:
    root = {A: 0.5**0.5, B: 0.3**0.5, C: 0.2**0.5}
    z = sum(root.values())
    freqs = first_token_frequencies(CFG.replace(temperature=2.0))
    assert freqs == pytest.approx({t: p / z for t, p in root.items()}, abs=0.04)


def test_top_k_never_draws_outside_the_k_best() -> None:
    freqs = first_token_frequencies(CFG.replace(top_k=2))
    assert freqs[C] == 0.0
    assert freqs[A] == pytest.approx(0.5 / 0.8, abs=0.04)


def test_reported_logprobs_are_the_model_logprobs_before_temperature() -> None:
    model = ScriptedStepModel([FIRST])
    [samples] = sample(model, model.inputs(), CFG.replace(num_samples=20, temperature=3.0))
    for h in samples:
        assert h.finished and len(h.tokens) == 1
        assert h.score == pytest.approx(sequence_logprob(model, 0, h.tokens), abs=1e-6)
        assert h.logprobs == pytest.approx([sequence_logprob(model, 0, h.tokens), 0.0], abs=1e-6)


def test_samples_per_image_follow_their_own_image_and_share_step_zero() -> None:
    scripts = [{(): {A: 1.0}, (A,): {B: 0.5, EOS: 0.5}}, {(): {D: 1.0}}]
    model = ScriptedStepModel(scripts)
    out = sample(model, model.inputs(), CFG.replace(num_samples=5))
    assert [len(row) for row in out] == [5, 5]
    assert all(h.tokens[0] == A for h in out[0])
    assert all(h.tokens == [D] for h in out[1])
    assert model.calls[0] == 2  # BOS once per image; expanded to 10 rows afterwards
    assert model.calls[1] == 10


def test_constraints_apply_while_sampling() -> None:
    model = RandomStepModel(images=1, vocab_size=8, seed=2, sharpness=0.1)
    cfg = CFG.replace(num_samples=50, min_len=3, forbid_tokens=(D,), prune_finished=False)
    [samples] = decode(model, model.inputs(), cfg)
    for h in samples:
        assert len(h.tokens) >= 3
        assert D not in h.tokens and PAD not in h.tokens and BOS not in h.tokens
        assert h.score == pytest.approx(sequence_logprob(model, 0, h.tokens, EOS if h.finished else None), abs=1e-4)


def test_invalid_sampling_config_is_rejected() -> None:
    with pytest.raises(DecodeCfgError, match="temperature"):
        CFG.replace(temperature=0.0)
    with pytest.raises(DecodeCfgError, match="num_samples"):
        CFG.replace(num_samples=0)


def test_seeded_sampling_does_not_touch_the_global_generators() -> None:
    np.random.seed(0)
    expected = np.random.rand(3)
    np.random.seed(0)
    model = ScriptedStepModel([FIRST])
    sample(model, model.inputs(), CFG.replace(num_samples=10))
    assert np.array_equal(np.random.rand(3), expected)


def test_seeded_samples_are_the_same_on_every_array_backend() -> None:
    from tests.runtime.decoding import fakes

    model = RandomStepModel(images=2, vocab_size=8, seed=5, sharpness=0.5)
    cfg = CFG.replace(num_samples=6)
    got = sample(model, model.inputs(), cfg)
    previous, fakes.BACKEND = fakes.BACKEND, "numpy"
    try:
        on_numpy = sample(model, model.inputs(), cfg)
    finally:
        fakes.BACKEND = previous
    assert got == on_numpy
    assert [h.logprobs for row in got for h in row] == [h.logprobs for row in on_numpy for h in row]
