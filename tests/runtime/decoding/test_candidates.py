"""Candidate picking and the static-mask forms the beam search ranks with: exact against a full sort."""

from __future__ import annotations

import numpy as np
import pytest

from edgecap.runtime.decoding import DecodeCfg, RadixSpec
from edgecap.runtime.decoding.processors import ProcessorPlan, build_processors
from edgecap.runtime.decoding.search import ranked, top_candidates

NAN, INF = np.float32(np.nan), np.float32(np.inf)


@pytest.mark.parametrize("groups", [1, 3])
def test_top_candidates_stay_distinct_after_a_nan_pick(groups: int) -> None:
    # Once -inf is reached the argmax lands on an earlier pick; at batch 1 that pick's *total* was NaN, which hid the
    # -inf and repeated index 0 three times.
    total = np.tile(np.array([[NAN, -INF, -INF, -INF]], dtype=np.float32), (groups, 1))
    values, idx, _ = top_candidates(total, 3)
    assert idx.tolist() == [[0, 1, 2]] * groups
    assert np.isnan(values[:, 0]).all() and (values[:, 1:] == -INF).all()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("groups", [1, 5])
def test_top_candidates_equal_a_full_ranking(seed: int, groups: int) -> None:
    rng = np.random.default_rng(seed)
    total = np.round(rng.standard_normal((groups, 12)), 1).astype(np.float32)  # ties
    total[rng.random(total.shape) < 0.4] = -INF
    total[rng.random(total.shape) < 0.1] = NAN
    for count in (1, 4, 12):
        _, idx, _ = top_candidates(total, count)
        assert idx.tolist() == ranked(total)[:, :count].tolist()


@pytest.mark.parametrize(
    "cfg",
    [
        DecodeCfg(max_len=6, min_len=2),
        DecodeCfg(max_len=6, forbid_tokens=(4, 5, 7)),
        DecodeCfg(max_len=7, pad_id=0, bos_id=13, eos_id=14, radix=RadixSpec(12, 1, 5)),
        DecodeCfg(max_len=7, pad_id=0, bos_id=5, eos_id=6, radix=RadixSpec(4, 2, 11), no_repeat_ngram=2),
    ],
)
def test_mask_columns_describe_the_bias(cfg: DecodeCfg) -> None:
    vocab = cfg.radix.base + 3 if cfg.radix is not None else 9
    plan = ProcessorPlan(build_processors(cfg), cfg.max_len, vocab)
    for t in range(cfg.max_len):
        bias, columns = plan.bias(t), plan.mask_columns(t)
        assert (bias is None) == (columns is None)
        if bias is None:
            continue
        banned = np.flatnonzero(bias == -INF)
        assert columns.banned.tolist() == banned.tolist()
        assert columns.allowed.tolist() == np.setdiff1d(np.arange(vocab), banned).tolist()
        for ids, runs in ((columns.allowed, columns.allowed_runs), (columns.banned, columns.banned_runs)):
            assert [i for start, stop in runs for i in range(start, stop)] == ids.tolist()
            assert all(b[0] > a[1] for a, b in zip(runs, runs[1:], strict=False))  # maximal: runs never touch
        assert not bias.flags.writeable and not columns.allowed.flags.writeable
