"""The vectorised beam search returns exactly what the per-image search returns (``decoding/_beam_rows.py``, itself
held to the frozen pre-numpy search by ``test_search_equivalence.py``).

Property-based: random batches (up to dozens of images), beam widths (wider than the vocabulary too), vocabularies,
``max_len``, ``min_len``, length penalties, ``n_best``, pruning on and off, radix constraints whose word-boundary masks
leave few allowed tokens, and log-prob tables with EOS likely at random steps, tied values, ``-inf`` entries, NaN at
allowed tokens and NaN / ``+inf`` at always-banned tokens. Every hypothesis must match bit for bit (tokens, score,
per-token log-probs, finished flag, order; floats by ``repr``), and so must the tokens fed to the model at every step.
The vectorised form is forced at every batch size (``beam.SMALL_BATCH`` set to 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgecap.runtime.decoding import DecodeCfg, RadixSpec, beam_search
from edgecap.runtime.decoding import beam as beam_module
from edgecap.runtime.decoding.arrays import to_numpy
from tests.runtime.decoding.fakes import as_backend, check_index


class TableStepModel:
    """Log-probs looked up by (step, a hash of the row's prefix) in a table drawn once: cheap enough for wide batches,
    and every reorder by ``select`` shows in what the rows see next.

    Args:
        images: B.
        table: (rows, V) float32 log-probs; a row's distribution is ``table[hash % rows]``.
        eos_id: EOS, boosted from ``eos_from`` on in the rows of ``eos_rows`` (a per-table-row bool).
        eos_from: step from which EOS gets likely in those rows.
    """

    def __init__(self, images: int, table: np.ndarray, eos_id: int, eos_rows: np.ndarray, eos_from: int) -> None:
        self.images, self.table, self.eos_id = images, table, eos_id
        self.eos_rows, self.eos_from = eos_rows, eos_from
        self.fed: list[list[int]] = []
        self.t = 0

    def inputs(self) -> dict[str, Any]:
        return {"image": as_backend(np.arange(self.images, dtype=np.int64))}

    def encode(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        self.t = 0
        image = to_numpy(inputs["image"], np.int64)
        return {"hash": image * 7919 + 17}

    def step(self, tokens: np.ndarray, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        check_index(tokens, "step tokens")
        self.fed.append(tokens.tolist())
        hashed = (state["hash"] * 1000003 + tokens * 31 + self.t) % 2_147_483_647
        rows = hashed % self.table.shape[0]
        logprobs = self.table[rows].copy()
        if self.t >= self.eos_from:
            boost = self.eos_rows[rows]
            logprobs[boost, self.eos_id] = np.float32(-0.05)
        self.t += 1
        return as_backend(logprobs), {"hash": hashed}

    def select(self, state: dict[str, Any], index: np.ndarray) -> dict[str, Any]:
        check_index(index, "select index")
        return {"hash": state["hash"][index]}


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, Any], DecodeCfg]:
    """One (step-model arguments, cfg) pair."""
    max_len = draw(st.integers(1, 12))
    beam = draw(st.integers(1, 6))
    if draw(st.booleans()):  # radix: the word-boundary mask bans most digits when few words exist
        base = draw(st.integers(2, 14))
        digits = draw(st.integers(1, 2))
        words = draw(st.integers(1, base**digits))
        radix = RadixSpec(base, digits, words, allow_unk=draw(st.booleans()))
        vocab, ids = base + 3, {"pad_id": 0, "bos_id": base + 1, "eos_id": base + 2}
    else:
        radix, vocab, ids = None, draw(st.integers(4, 40)), {"pad_id": 0, "bos_id": 1, "eos_id": 2}
    forbid = ()
    if radix is None and draw(st.booleans()):  # many forbidden tokens: few allowed ones
        forbid = tuple(t for t in range(3, vocab) if draw(st.integers(0, 3)) > 0)
    cfg = DecodeCfg(
        max_len=max_len,
        min_len=draw(st.integers(0, max_len - 1)),
        beam_size=beam,
        n_best=draw(st.integers(1, beam)),
        length_penalty=draw(st.sampled_from(["none", "wu", "avg"])),
        length_penalty_alpha=draw(st.sampled_from([0.0, 0.6, 1.0, 2.0])),
        forbid_tokens=forbid,
        radix=radix,
        prune_finished=draw(st.booleans()),
        **ids,
    )
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    table_rows = draw(st.integers(1, 64))
    logits = rng.standard_normal((table_rows, vocab)) * draw(st.sampled_from([0.5, 2.0, 6.0]))
    quantum = draw(st.sampled_from([0.0, 0.0, 0.5, 2.0]))
    if quantum:  # tied log-probs
        logits = np.round(logits / quantum) * quantum
    logits[rng.random((table_rows, vocab)) < draw(st.sampled_from([0.0, 0.0, 0.3, 0.9]))] = -np.inf
    logits[:, ids["eos_id"]] = np.where(rng.random(table_rows) < 0.5, logits[:, ids["eos_id"]], 0.0)
    with np.errstate(invalid="ignore"):
        table = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    table = np.where(np.isnan(table), -np.inf, table).astype(np.float32)  # all -inf rows stay -inf
    if draw(st.integers(0, 5)) == 0:  # NaN at an allowed token: running sums turn NaN and rank first
        table[rng.random(table_rows) < 0.3, draw(st.integers(3, vocab - 1))] = math.nan
    if draw(st.integers(0, 4)) == 0:  # garbage the mask hides: NaN / +inf at PAD and BOS, always banned
        table[:, ids["pad_id"]] = math.nan
        table[:, ids["bos_id"]] = draw(st.sampled_from([math.inf, math.nan]))
    model = {
        "images": draw(st.integers(1, 40)),
        "table": table,
        "eos_id": ids["eos_id"],
        "eos_rows": rng.random(table_rows) < draw(st.sampled_from([0.0, 0.3, 1.0])),
        "eos_from": draw(st.integers(0, max_len)),
    }
    return model, cfg


def _per_image_and_vectorised(old: TableStepModel, new: TableStepModel, cfg: DecodeCfg) -> tuple[list, list]:
    """``old`` decoded on the per-image path, ``new`` on the vectorised one (``beam.SMALL_BATCH`` moved), exactly."""
    previous = beam_module.SMALL_BATCH
    try:
        beam_module.SMALL_BATCH = 10**9
        expected = _exact(beam_search(old, old.inputs(), cfg))
        beam_module.SMALL_BATCH = 0
        got = _exact(beam_search(new, new.inputs(), cfg))
    finally:
        beam_module.SMALL_BATCH = previous
    return expected, got


def _exact(result: list[list[Any]]) -> list[list[tuple[str, str, str, bool]]]:
    return [[(repr(h.tokens), repr(h.score), repr(h.logprobs), h.finished) for h in hyps] for hyps in result]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=cases())
def test_equals_the_per_image_search(case: tuple[dict[str, Any], DecodeCfg]) -> None:
    model_kw, cfg = case
    old, new = TableStepModel(**model_kw), TableStepModel(**model_kw)
    with np.errstate(invalid="ignore"):
        expected, got = _per_image_and_vectorised(old, new, cfg)
    assert got == expected
    assert new.fed == old.fed


def test_equals_the_per_image_search_at_the_edge_setting() -> None:
    # The benchmarked setting at a wide batch: radix 771 classes (one base-768 digit, 121 words), beam 3, EOS likely
    # from step 10 on in half the table's rows, pruning on and off.
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((97, 771)) * 3
    table = (logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)).astype(np.float32)
    spec = RadixSpec(768, 1, 121)
    for prune in (True, False):
        cfg = DecodeCfg(pad_id=0, bos_id=769, eos_id=770, radix=spec, beam_size=3, max_len=26, prune_finished=prune)
        kw = {"images": 64, "table": table, "eos_id": 770, "eos_rows": rng.random(97) < 0.5, "eos_from": 10}
        old, new = TableStepModel(**kw), TableStepModel(**kw)
        expected, got = _per_image_and_vectorised(old, new, cfg)
        assert got == expected
        assert new.fed == old.fed
