"""Sampling and the on-change gate (edgecap.runtime.stream.sampling): samples on the stream's own timestamps, and a
gate that catches changes of scene and skips static stretches, on synthetic embeddings and on a real bundle's."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgecap.runtime.backends.registry import CaptionerError
from edgecap.runtime.captioner import Captioner
from edgecap.runtime.stream.frames import Frame
from edgecap.runtime.stream.sampling import (
    DEFAULT_CHANGE_THRESHOLD,
    ChangeGate,
    Sampler,
    cosine_distance,
    pool_state,
    pooled_embedding,
)
from edgecap.runtime.stream.sources import open_source
from tests.runtime.bundle.helpers import pixel_bundle
from tests.runtime.stream.videos import SCENES, scene_starts

BLANK = np.zeros((2, 2, 3), np.uint8)


def taken(sampler: Sampler, times: list[float]) -> list[int]:
    return [i for i, t in enumerate(times) if sampler.take(Frame(BLANK, t, i))]


def test_every_samples_on_the_streams_timestamps() -> None:
    ntsc = [i * 1001 / 30000 for i in range(90)]  # 29.97 fps: no frame falls on a multiple of 0.5 s
    picked = taken(Sampler(every_s=0.5), ntsc)
    assert picked == [0, 15, 30, 45, 60, 75]  # the first frame at or after each 0.5 s
    assert all(ntsc[i] >= k * 0.5 - 1e-9 and ntsc[i] - k * 0.5 < 1001 / 30000 for k, i in enumerate(picked))
    assert taken(Sampler(every_s=0.5), [i / 10 for i in range(40)]) == [0, 5, 10, 15, 20, 25, 30, 35]  # exact ties


def test_fps_samples_at_that_rate_and_neither_takes_every_frame() -> None:
    times = [i / 30 for i in range(60)]
    assert taken(Sampler(fps=3), times) == list(range(0, 60, 10))
    assert taken(Sampler(fps=30), times) == list(range(60))
    assert taken(Sampler(fps=100), times) == list(range(60))  # faster than the stream: every frame, no repeats
    assert taken(Sampler(), times) == list(range(60))


def test_the_clock_is_the_streams_not_the_wall() -> None:
    """A stream decoded slowly, or in bursts, is sampled exactly as one decoded at once."""
    times = [i / 10 for i in range(30)]
    slow = Sampler(every_s=1.0)
    picked = []
    for i, t in enumerate(times):
        if i % 7 == 0:
            time.sleep(0.01)  # bursts and stalls of decoding
        if slow.take(Frame(BLANK, t, i)):
            picked.append(i)
    assert picked == taken(Sampler(every_s=1.0), times) == [0, 10, 20]


def test_a_gap_skips_its_periods_and_a_restart_starts_again() -> None:
    # a camera stalls from 1.1 s to 3.4 s: one sample after it, not a burst catching up on 1.5, 2.0, ... 3.0;
    # then the grid goes on (3.5, 4.0, 4.5)
    times = [0.0, 0.5, 1.0, 1.1, 3.4, 3.45, 3.5, 4.0, 4.2, 4.6]
    assert taken(Sampler(every_s=0.5), times) == [0, 1, 2, 4, 6, 7, 9]
    # a source that starts over (a looping file): the count restarts from its new first frame
    assert taken(Sampler(every_s=1.0), [0.0, 1.0, 2.0, 0.0, 0.5, 1.0]) == [0, 1, 2, 3, 5]


def test_the_sampler_on_a_decoded_clip(scenes_clip: Path) -> None:
    sampler = Sampler(every_s=0.5)
    source = open_source(scenes_clip)
    try:
        samples = [f for f in source if sampler.take(f)]
    finally:
        source.close()
    assert [f.index for f in samples] == list(range(0, 80, 5))
    assert [f.pts_s for f in samples] == pytest.approx([k * 0.5 for k in range(16)], abs=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every_s": 1.0, "fps": 2.0}, "give one"),
        ({"every_s": 0}, "every must be a positive number"),
        ({"fps": -1}, "fps must be a positive number"),
        ({"every_s": float("nan")}, "every must be"),
        ({"fps": True}, "fps must be"),
    ],
)
def test_bad_sampling_is_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(CaptionerError, match=message):
        Sampler(**kwargs)


def _direction(seed: int, dim: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=dim)


def test_the_gate_catches_changes_and_skips_static_stretches() -> None:
    """Three scenes of ten noisy samples each (noise well under the threshold): the first sample of each scene
    passes, the rest are skipped."""
    rng = np.random.default_rng(0)
    gate = ChangeGate(0.05)
    passed = []
    for scene in range(3):
        base = _direction(scene)
        for _ in range(10):
            passed.append(gate.changed(base + rng.normal(scale=0.02, size=base.shape)))
    assert [i for i, p in enumerate(passed) if p] == [0, 10, 20]


def test_the_gate_compares_with_the_last_captioned_sample() -> None:
    """A slow drift, each step under the threshold, passes once it adds up (comparing with the previous sample
    would skip it for ever)."""
    a, b = _direction(1), _direction(2)
    gate = ChangeGate(0.1)
    steps = [a + (b - a) * k / 20 for k in range(21)]
    assert all(cosine_distance(x, y) < 0.1 for x, y in itertools.pairwise(steps))
    passed = [k for k, v in enumerate(steps) if gate.changed(v)]
    assert passed[0] == 0 and len(passed) >= 2
    for earlier, later in itertools.pairwise(passed):
        assert cosine_distance(steps[earlier], steps[later]) >= 0.1
        assert cosine_distance(steps[earlier], steps[later - 1]) < 0.1  # passed as soon as it reached the threshold
    gate.reset()
    assert gate.changed(steps[-1]) and gate.last_distance is None


def test_gate_thresholds_and_distances() -> None:
    assert ChangeGate().threshold == DEFAULT_CHANGE_THRESHOLD
    gate = ChangeGate(0.0)  # every sample passes
    assert gate.changed(_direction(0)) and gate.changed(_direction(0))
    for bad in (-0.1, 2.5, True, float("nan"), "0.1"):
        with pytest.raises(CaptionerError, match="cosine distance in"):
            ChangeGate(bad)  # type: ignore[arg-type]
    v = _direction(3)
    assert cosine_distance(v, 3 * v) == pytest.approx(0.0, abs=1e-12)
    assert cosine_distance(v, -v) == pytest.approx(2.0)
    assert cosine_distance(np.zeros(4), np.zeros(4)) == 0.0 and cosine_distance(np.zeros(4), np.ones(4)) == 1.0


def test_pool_state_pools_the_real_positions_only() -> None:
    memory = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    padded = memory.copy()
    padded[1, 2] = 1e6  # padding: must not count
    bias = np.zeros((2, 1, 1, 3), np.float32)
    bias[1, ..., 2] = -1e4
    pooled = pool_state({"memory": padded, "memory_bias": bias})
    assert pooled.shape == (2, 4)
    np.testing.assert_allclose(pooled, [memory[0].mean(0), memory[1, :2].mean(0)])
    # an ONNX encoder's state: the first layer's cross-attention keys (B, layers, heads, N, d)
    keys = np.random.default_rng(0).normal(size=(2, 3, 2, 5, 4)).astype(np.float32)
    pooled = pool_state({"cross_k": keys, "memory_bias": np.zeros((2, 1, 1, 5), np.float32), "self_k0": keys[:, 0]})
    np.testing.assert_allclose(pooled, keys[:, 0].mean(axis=2).reshape(2, -1), rtol=1e-6)
    assert pool_state({"memory_mean": memory[:, 0]}).shape == (2, 4)
    with pytest.raises(ValueError, match="no image memory"):
        pool_state({"logits": memory})


class _CoupledModel:
    """A step model whose rows are coupled (a dynamic INT8 graph): it records the batch of every encode call."""

    rows_independent = False

    def __init__(self) -> None:
        self.batches: list[int] = []

    def encode(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        pixels = inputs["pixel_values"]
        self.batches.append(len(pixels))
        return {"memory": pixels.reshape(len(pixels), 3, -1).transpose(0, 2, 1)}


def test_embeddings_of_a_coupled_model_are_computed_image_by_image() -> None:
    class Captioner:
        step_model = _CoupledModel()

    pixels = np.random.default_rng(0).normal(size=(3, 3, 4, 4)).astype(np.float32)
    pooled = pooled_embedding(Captioner(), {"pixel_values": pixels})
    assert Captioner.step_model.batches == [1, 1, 1]
    np.testing.assert_allclose(pooled, pixels.mean(axis=(2, 3)), rtol=1e-6)
    features = {"features": pixels.reshape(3, 3, 16), "feature_mask": np.ones((3, 3), bool)}
    np.testing.assert_allclose(pooled_embedding(Captioner(), features), pixels.reshape(3, 3, 16).mean(1))
    assert Captioner.step_model.batches == [1, 1, 1]  # features are pooled as they are: no encoder call


@pytest.fixture(scope="module")
def captioner(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captioner]:
    bundle, _ = pixel_bundle(tiny_data, tmp_path_factory)
    with Captioner.load(bundle, runtime="onnxruntime", threads=1) as cap:
        yield cap


def test_pooled_embeddings_of_a_real_bundle_tell_scenes_apart(captioner: Captioner, scenes_clip: Path) -> None:
    """On the tiny pixels-in bundle (an untrained random backbone: its distances are small, the threshold is set
    from them), the gate over the clip's samples passes exactly one sample per scene: the first after each change."""
    source = open_source(scenes_clip)
    sampler = Sampler(every_s=0.5)
    try:
        samples = [f for f in source if sampler.take(f)]
    finally:
        source.close()
    embeddings = pooled_embedding(captioner, captioner.inputs([f.image for f in samples]))
    assert embeddings.shape[0] == len(samples) == 16 and embeddings.dtype == np.float32
    starts = scene_starts(SCENES)
    scene = [max(k for k, s in enumerate(starts) if s <= f.pts_s + 1e-6) for f in samples]
    pairs = list(itertools.combinations(range(len(samples)), 2))
    within = max(cosine_distance(embeddings[i], embeddings[j]) for i, j in pairs if scene[i] == scene[j])
    between = min(
        cosine_distance(embeddings[i], embeddings[j]) for i, j in pairs if SCENES[scene[i]][1] != SCENES[scene[j]][1]
    )
    assert within * 10 < between, (within, between)
    gate = ChangeGate(float(np.sqrt(max(within, 1e-9) * between)))  # between the two, on a log scale
    passed = [f.pts_s for f, e in zip(samples, embeddings, strict=True) if gate.changed(e)]
    assert passed == pytest.approx(starts)  # 0, 2, 4, 5: each change caught at its first sample
    # one sample's embedding does not depend on the batch it was computed in
    alone = pooled_embedding(captioner, captioner.inputs([samples[5].image]))
    np.testing.assert_allclose(alone[0], embeddings[5], rtol=1e-4, atol=1e-6)
