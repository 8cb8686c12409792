"""Parity statistics leave out "never" entries (the −1e4 logit of a class a model cannot emit), which agree on what
they mean but differ by a float32 rounding step of ~1e-3 at that magnitude."""

from __future__ import annotations

import numpy as np

from edgecap.workshop.export.parity import NEVER_BELOW, compare_arrays
from edgecap.workshop.export.spec import Tolerance


def _log_probs(rows: int = 3, classes: int = 12) -> np.ndarray:
    """Step log-probs of an imported ORT model: PAD and BOS (columns 0, 1) carry the −1e4 bias."""
    logits = np.random.default_rng(0).normal(size=(rows, classes))
    logits[:, :2] = -1e4
    shifted = logits - logits.max(axis=1, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))).astype(np.float32)


def test_never_columns_do_not_dominate_the_error_and_are_counted():
    expected = _log_probs()
    actual = expected.copy()
    actual[:, :2] = np.nextafter(expected[:, :2], np.float32(0))  # one float32 step: ~9.8e-4 at 1e4
    actual[:, 2:] += np.float32(3e-7)
    report = compare_arrays(actual, expected, Tolerance(atol=1e-4, rtol=1e-4))
    assert report["passed"] and report["never"] == 6
    assert report["max_abs"] < 1e-6 and report["max_rel"] < 1e-5  # the real error, readable beside atol 1e-4


def test_a_never_entry_that_became_possible_is_a_violation():
    expected = _log_probs()
    actual = expected.copy()
    actual[0, 0] = -20.0  # PAD is suddenly likely: not a rounding step
    report = compare_arrays(actual, expected, Tolerance(atol=1e-4, rtol=1e-4))
    assert not report["passed"] and report["violations"] == 1 and report["never"] == 5
    assert NEVER_BELOW < -1e3
