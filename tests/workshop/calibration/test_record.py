"""Recording decoder-step feeds: bounded sampling, and feeds that are what decoding really fed the step graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgecap.runtime.decoding import DecodeCfg, decode
from edgecap.workshop.export.calibration import CalibrationError, FeedRecorder, RecordingStepModel, record_decoder_feeds

PAD, BOS, EOS, V = 0, 1, 2, 6


def offer(recorder: FeedRecorder, count: int) -> None:
    for i in range(count):
        recorder.add({"id": np.array([i])})


def kept_ids(recorder: FeedRecorder) -> list[int]:
    return [int(f["id"][0]) for f in recorder.feeds]


# -- FeedRecorder ----------------------------------------------------------------------------------------------------
def test_recorder_caps_with_a_uniform_ordered_seeded_sample() -> None:
    a, b = FeedRecorder(max_feeds=10, seed=1), FeedRecorder(max_feeds=10, seed=1)
    offer(a, 200)
    offer(b, 200)
    ids = kept_ids(a)
    assert len(a) == 10 and a.offered == 200
    assert ids == sorted(ids) and ids == kept_ids(b)  # recording order, deterministic
    assert max(ids) > 100  # late steps are represented, not just the first ten
    other = FeedRecorder(max_feeds=10, seed=2)
    offer(other, 200)
    assert kept_ids(other) != ids


def test_recorder_subsamples_every_kth_and_copies() -> None:
    recorder = FeedRecorder(max_feeds=100, every=3)
    offer(recorder, 9)
    assert kept_ids(recorder) == [0, 3, 6] and recorder.considered == 3
    buffer = np.zeros(4, np.float32)
    recorder.add({"id": np.array([9]), "x": buffer})
    buffer[:] = 7  # the decoder may reuse its buffers
    assert recorder.feeds[-1]["x"].sum() == 0
    assert recorder.nbytes == sum(v.nbytes for f in recorder.feeds for v in f.values())


@pytest.mark.parametrize("bad", [{"max_feeds": 0}, {"every": 0}, {"max_feeds": 2.5}])
def test_recorder_rejects_bad_limits(bad: dict) -> None:
    with pytest.raises(CalibrationError):
        FeedRecorder(**bad)


# -- a scripted step model -------------------------------------------------------------------------------------------
class Scripted:
    """Emits 3, 4, 5, EOS (token 3 + step) and keeps every token fed to it in a (B, T, 1) float cache."""

    def encode(self, inputs):
        batch = inputs["x"].shape[0]
        return {"cache": torch.zeros(batch, 0, 1), "bias": torch.as_tensor(inputs["x"]).float()}  # numpy or torch

    def step(self, tokens, state):
        t = state["cache"].shape[1]
        logprobs = torch.full((tokens.shape[0], V), -9.0)
        logprobs[:, 3 + t if t < 3 else EOS] = 0.0
        cache = torch.cat([state["cache"], torch.from_numpy(tokens)[:, None, None].float()], dim=1)
        return logprobs, {**state, "cache": cache}

    def select(self, state, index):  # the search's int64 numpy rows, converted like TorchStepModel does
        return {k: v.index_select(0, torch.from_numpy(index)) for k, v in state.items()}


def test_recorded_feeds_are_what_decoding_fed() -> None:
    recorder = FeedRecorder()
    cfg = DecodeCfg(strategy="greedy", max_len=6, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    inputs = [{"x": np.ones((2, 3), np.float32)}]
    record_decoder_feeds(Scripted(), inputs, cfg, ["cache", "bias"], recorder=recorder)
    feeds = recorder.feeds
    assert [f["tokens"].tolist() for f in feeds] == [[BOS, BOS], [3, 3], [4, 4], [5, 5]]
    assert [f["cache"].shape[1] for f in feeds] == [0, 1, 2, 3]  # the cache grows one position per step
    np.testing.assert_array_equal(feeds[3]["cache"][0, :, 0], [BOS, 3, 4])
    assert all(f["tokens"].dtype == np.int64 and set(f) == {"tokens", "cache", "bias"} for f in feeds)


def test_recording_needs_the_state_names() -> None:
    wrapped = RecordingStepModel(Scripted(), FeedRecorder(), ["cache", "self_k"])
    state = wrapped.encode({"x": torch.ones(1, 2)})
    with pytest.raises(CalibrationError, match=r"lacks \['self_k'\]"):
        wrapped.step(np.array([BOS], dtype=np.int64), state)


def test_no_inputs_is_an_empty_calibration_set() -> None:
    cfg = DecodeCfg(strategy="greedy", max_len=4, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    with pytest.raises(CalibrationError, match="empty calibration set"):
        record_decoder_feeds(Scripted(), [], cfg, ["cache"])


# -- the exported model on ONNX Runtime ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fp32_step_model(acort):
    from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model

    with create_onnxruntime_step_model(acort.fp32["encoder"], acort.fp32["step"], acort.spec.state_names) as step_model:
        yield step_model


def test_greedy_recording_on_onnx_runtime_is_realistic(acort, fp32_step_model, region_feeds) -> None:
    batches = region_feeds(2, batch=3, seed=5)
    cfg = acort.cfg("greedy", prune_finished=False)  # full batch every step: one feed row per image
    recorder = record_decoder_feeds(fp32_step_model, batches, cfg, acort.spec.state_names)
    feeds = recorder.feeds
    expected = {"tokens", *acort.spec.state_names}
    assert feeds and all(set(f) == expected for f in feeds)

    per_batch, start = [], 0
    for i, f in enumerate(feeds):  # split the recording at each BOS step
        if i and f["self_k0"].shape[2] == 0:  # one (B, H, T, d_k) cache per decoder position
            per_batch.append(feeds[start:i])
            start = i
    per_batch.append(feeds[start:])
    assert len(per_batch) == len(batches)

    for batch, steps in zip(batches, per_batch, strict=True):
        assert steps[0]["tokens"].tolist() == [cfg.bos_id] * 3
        assert [s["self_k0"].shape[2] for s in steps] == list(range(len(steps)))  # cache length = step
        assert all(np.abs(s["self_k0"]).max() > 0 for s in steps[1:])  # real keys, not zeros
        encoded = fp32_step_model.encode(batch)
        np.testing.assert_allclose(steps[-1]["cross_k"], encoded["cross_k"], rtol=1e-6, atol=1e-6)
        hypotheses = decode(fp32_step_model, {k: torch.from_numpy(v) for k, v in batch.items()}, cfg)
        for row, hyps in enumerate(hypotheses):
            fed = [int(s["tokens"][row]) for s in steps[1 : 1 + len(hyps[0].tokens)]]
            assert fed == hyps[0].tokens[: len(fed)]  # the tokens recorded are the tokens decoding chose


def test_beam_recording_is_capped_and_covers_long_caches(acort, fp32_step_model, region_feeds) -> None:
    cfg = acort.cfg("beam", beam_size=3)
    recorder = record_decoder_feeds(
        fp32_step_model, region_feeds(3, batch=2, seed=6), cfg, acort.spec.state_names, recorder=FeedRecorder(6)
    )
    assert len(recorder) == 6 and recorder.offered > 6
    rows = {int(f["tokens"].shape[0]) for f in recorder.feeds}
    assert rows <= {2, 4, 6} and max(rows) > 2  # B images at step 0, up to B·K beams afterwards
    stats = recorder.stats(("self_k0", 2))
    assert stats["kept"] == 6 and stats["self_k0_axis2"][1] >= 3


def test_recorder_subsamples_rows_and_respects_a_byte_budget() -> None:
    recorder = FeedRecorder(max_feeds=100, max_rows=3, max_bytes=5 * (3 * 8 + 3 * 8 * 4))  # five 3-row feeds
    for i in range(40):
        recorder.add({"tokens": np.arange(6) + 10 * i, "state": np.full((6, 8), float(i), np.float32)})
    assert len(recorder) == 5 and recorder.nbytes <= recorder.max_bytes
    for feed in recorder.feeds:
        assert feed["tokens"].shape == (3,) and feed["state"].shape == (3, 8)
        image = int(feed["state"][0, 0])
        rows = feed["tokens"] - 10 * image  # the same rows were taken from every tensor
        assert set(rows.tolist()) <= set(range(6)) and list(rows) == sorted(rows)
    assert max(int(f["state"][0, 0]) for f in recorder.feeds) > 5  # later feeds still replace kept ones
