"""The stream pipeline (edgecap.runtime.stream.pipeline): events at the sampled timestamps, the same captions as
``Captioner.batch``, the drop policy of live sources against files, bounded memory and latency, errors after good
frames, and a stopped consumer stopping the reader thread."""

from __future__ import annotations

import re
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgecap.runtime.captioner import Captioner, CaptionerError
from edgecap.runtime.images.load import ImageError
from edgecap.runtime.length import NO_LENGTH_CONTROL, LengthLevelError
from edgecap.runtime.stream.events import STAGES, StreamEvent
from edgecap.runtime.stream.frames import Frame
from edgecap.runtime.stream.pipeline import SampleQueue, _Sample
from edgecap.runtime.stream.sources import StreamSourceError
from tests.runtime.bundle.helpers import pixel_bundle
from tests.runtime.stream.conftest import SCENES
from tests.runtime.stream.videos import scene_starts

SIZE = 64
#: The on-change threshold for the tiny bundle's random 64 px backbone: on the scenes clip its pooled embeddings move
#: about 1e-5 (cosine distance) between noisy frames of one scene and 0.01 or more at a change of scene (the
#: calibrated default, for trained backbones, is in edgecap.runtime.stream.sampling).
TINY_THRESHOLD = 0.002


@pytest.fixture(scope="module")
def captioner(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captioner]:
    bundle, _ = pixel_bundle(tiny_data, tmp_path_factory)
    with Captioner.load(bundle, runtime="onnxruntime", threads=1) as cap:
        yield cap


def scene(k: int, size: int = SIZE) -> np.ndarray:
    """A distinct synthetic picture per ``k``: a colour field with a bright square whose place depends on ``k``."""
    rng = np.random.default_rng(k)
    image = np.empty((size, size, 3), np.uint8)
    image[:] = rng.integers(0, 256, size=3, dtype=np.uint8)
    x, y = (k * 13) % (size // 2), (k * 29) % (size // 2)
    image[y : y + size // 2, x : x + size // 2] = 255 - image[0, 0]
    return image


class FakeSource:
    """A ``FrameSource`` over a frame generator: ``live`` chooses the drop policy; ``fail_after`` frames, it raises
    a source error; ``delay_s`` between frames stands for a camera's frame period."""

    def __init__(
        self,
        n: int | None,
        *,
        live: bool,
        fps: float = 10.0,
        images: list[np.ndarray] | None = None,
        fail_after: int | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.name, self.live, self.fps = "fake", live, fps
        self.n, self.images, self.fail_after, self.delay_s = n, images, fail_after, delay_s
        self.closed = threading.Event()
        self.made = 0

    def __iter__(self) -> Iterator[Frame]:
        i = 0
        while self.n is None or i < self.n:
            if self.fail_after is not None and i == self.fail_after:
                raise StreamSourceError(f"fake: stopped after frame {i - 1} at {(i - 1) / self.fps:.3f} s: corrupt")
            if self.delay_s:
                time.sleep(self.delay_s)
            image = self.images[i % len(self.images)] if self.images else scene(i)
            self.made += 1
            yield Frame(image=image, pts_s=i / self.fps, index=i)
            i += 1

    def close(self) -> None:
        self.closed.set()


def test_events_come_at_the_sampled_timestamps(captioner: Captioner) -> None:
    stream = captioner.stream(FakeSource(40, live=False, fps=10.0), every=0.5, max_batch=3)
    events = list(stream)
    assert [e.index for e in events] == list(range(0, 40, 5))
    assert [e.pts_s for e in events] == pytest.approx([i * 0.5 for i in range(8)])
    assert all(isinstance(e, StreamEvent) and e.caption for e in events)
    assert all(set(e.latency_s) == set(STAGES) and all(v >= 0 for v in e.latency_s.values()) for e in events)
    summary = stream.summary
    assert summary is not None and (summary.frames, summary.samples, summary.captioned) == (40, 8, 8)
    assert (summary.skipped, summary.dropped, summary.error, summary.interrupted) == (0, 0, None, False)
    assert summary.media_s == pytest.approx(4.0)  # 40 frames at 10 fps
    assert summary.real_time_factor is not None and summary.real_time_factor > 0
    assert summary.latency_p50_s is not None and summary.latency_p99_s is not None
    assert summary.latency_p50_s <= summary.latency_p99_s


def test_a_video_file_is_captioned_at_its_sampled_timestamps(captioner: Captioner, scenes_clip: Path) -> None:
    stream = captioner.stream(str(scenes_clip), every=0.5)  # 8 s at 10 fps
    events = list(stream)
    assert [e.pts_s for e in events] == pytest.approx([i * 0.5 for i in range(16)], abs=1e-6)
    assert [e.index for e in events] == list(range(0, 80, 5))
    summary = stream.summary
    assert summary is not None and (summary.frames, summary.samples, summary.captioned) == (80, 16, 16)
    assert summary.media_s == pytest.approx(8.0) and summary.end_s == pytest.approx(8.0)


def test_on_change_catches_every_scene_change_of_a_video_and_skips_the_static_stretches(
    captioner: Captioner, scenes_clip: Path
) -> None:
    stream = captioner.stream(str(scenes_clip), every=0.5, on_change=TINY_THRESHOLD)
    events = list(stream)
    for start in scene_starts(SCENES):  # 0, 2, 4 and 5 s: each captioned within one sample period
        assert any(start - 1e-6 <= e.pts_s < start + 0.5 for e in events), (start, [e.pts_s for e in events])
    summary = stream.summary
    assert summary is not None and summary.captioned + summary.skipped == summary.samples == 16
    assert summary.skipped >= 10  # of the 12 samples that show a scene already captioned
    assert sum(e.skipped for e in events) + _skipped_after(events, summary.samples) == summary.skipped


def test_the_stream_captions_as_batch_does_on_the_same_frames(captioner: Captioner) -> None:
    images = [scene(k) for k in range(7)]
    expected = captioner.batch(images)
    for max_batch in (1, 3, 8):  # batching is speed only: a caption never depends on its batch
        events = list(captioner.stream(FakeSource(7, live=False, images=images), max_batch=max_batch))
        assert [e.caption for e in events] == expected


def test_on_change_captions_each_new_scene_once_and_counts_the_skips(captioner: Captioner) -> None:
    """Three scenes of five identical frames each: a caption at each change; the rest skipped (identical frames are
    at distance 0, different scenes well above the tiny threshold), counted on the next event and in the summary."""
    images = [scene(k) for k in (0, 1, 2) for _ in range(5)]
    for max_batch in (1, 4):  # the gate runs sample by sample whatever the batch
        stream = captioner.stream(FakeSource(15, live=False, images=images), on_change=1e-4, max_batch=max_batch)
        events = list(stream)
        assert [(e.index, e.skipped) for e in events] == [(0, 0), (5, 4), (10, 4)]
        assert [e.caption for e in events] == captioner.batch([scene(k) for k in (0, 1, 2)])
        assert all(e.latency_s["gate"] > 0 for e in events)
        summary = stream.summary
        assert summary is not None and (summary.samples, summary.captioned, summary.skipped) == (15, 3, 12)


def test_a_file_source_never_drops_and_its_queue_stays_bounded(captioner: Captioner) -> None:
    source = FakeSource(60, live=False)
    stream = captioner.stream(source, max_batch=2, queue=3)
    events = list(stream)
    assert [e.index for e in events] == list(range(60))  # every sample, in order: the reader waited for room
    assert stream.summary is not None and stream.summary.dropped == 0 and sum(e.dropped for e in events) == 0
    assert stream.queue.high_water <= 3


def test_a_live_source_faster_than_the_model_drops_the_oldest_and_stays_bounded(captioner: Captioner) -> None:
    """A generator with no frame period feeds far faster than the model captions: the queue drops its oldest samples
    and counts them; what is queued, the memory and each sample's wait stay bounded by the queue's length."""
    queue, n = 4, 400
    source = FakeSource(n, live=True, fps=1000.0)
    tracemalloc.start()
    try:
        stream = captioner.stream(source, max_batch=1, queue=queue)
        events = list(stream)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    summary = stream.summary
    assert summary is not None and summary.live and summary.samples == n
    assert summary.dropped > 0 and summary.captioned + summary.dropped == n  # every sample captioned or counted
    assert sum(e.dropped for e in events) <= summary.dropped  # drops after the last caption are in the summary only
    assert [e.index for e in events] == sorted(e.index for e in events)
    assert stream.queue.high_water <= queue
    one_input = 3 * SIZE * SIZE * 4  # float32 pixel values of one sample
    assert peak < 2_000_000 + (queue + 4) * one_input * 4  # not n samples' worth (n * one_input ≈ 20 MB)
    caption_s = max(e.latency_s["caption"] for e in events)
    for event in events:  # a sample waits behind at most the queue's length of others (+ the one being captioned)
        assert event.latency_s["queue"] <= (queue + 1) * caption_s + 0.5


def test_a_source_error_comes_after_the_good_frames_events(captioner: Captioner) -> None:
    stream = captioner.stream(FakeSource(20, live=False, fail_after=6), max_batch=4)
    seen: list[int] = []
    with pytest.raises(StreamSourceError, match="stopped after frame 5"):
        for event in stream:
            seen.append(event.index)
    assert seen == list(range(6))
    assert stream.summary is not None and "stopped after frame 5" in (stream.summary.error or "")
    assert not stream.summary.interrupted


def test_a_reader_error_never_leaves_the_consumer_waiting(captioner: Captioner) -> None:
    bad = FakeSource(5, live=True, images=[np.zeros((4, 4, 5), np.uint8)])  # five channels: preprocessing refuses it
    started = time.perf_counter()
    with pytest.raises(ImageError):
        list(captioner.stream(bad))
    assert time.perf_counter() - started < 5
    assert bad.closed.is_set()


@pytest.mark.parametrize("how", ["close", "interrupt-in-consumer", "interrupt-in-decode"])
def test_stopping_the_consumer_stops_the_reader(
    captioner: Captioner, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    source = FakeSource(None, live=True, delay_s=0.002)  # endless
    stream = captioner.stream(source, max_batch=1, queue=2)
    if how == "interrupt-in-decode":
        calls = iter(range(10**6))
        real = captioner.caption

        def interrupted(*args: Any, **kwargs: Any) -> Any:
            if next(calls) == 2:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(captioner, "caption", interrupted)
        with pytest.raises(KeyboardInterrupt):
            list(stream)
    elif how == "interrupt-in-consumer":
        with pytest.raises(KeyboardInterrupt), stream:
            for i, _ in enumerate(stream):
                if i == 2:
                    raise KeyboardInterrupt
    else:
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()
    assert stream._reader is not None
    stream._reader.join(2)
    assert not stream._reader.is_alive() and source.closed.is_set()
    assert stream.summary is not None and stream.summary.interrupted and stream.summary.captioned >= 2


def test_closing_an_unstarted_stream_closes_its_source(captioner: Captioner) -> None:
    source = FakeSource(3, live=False)
    stream = captioner.stream(source)
    stream.close()
    assert source.closed.is_set() and list(stream) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch": 0}, "max_batch must be an integer >= 1"),
        ({"queue": 0}, "queue must be an integer >= 1"),
        ({"max_batch": 1.5}, "max_batch must be an integer >= 1"),
        ({"every": 1.0, "fps": 2.0}, "every and fps"),
        ({"on_change": 3.0}, "threshold"),
    ],
)
def test_bad_settings_are_refused_before_the_source_is_opened(
    captioner: Captioner, tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    missing = tmp_path / "not-there.mp4"  # opening it would fail with a source error instead
    with pytest.raises(CaptionerError, match=message):
        captioner.stream(str(missing), **kwargs)  # type: ignore[arg-type]


def test_a_length_level_the_model_cannot_take_is_refused_before_the_source_is_opened(
    captioner: Captioner, tmp_path: Path
) -> None:
    with pytest.raises(LengthLevelError, match=re.escape(NO_LENGTH_CONTROL)):
        captioner.stream(str(tmp_path / "not-there.mp4"), length_level=2)


def test_the_queue_drops_the_oldest_only_when_live() -> None:
    def sample(i: int) -> _Sample:
        return _Sample(float(i), i, {}, 0.0, 0.0, 0.0)

    live = SampleQueue(2, drop_oldest=True)
    for i in range(5):
        assert live.put(sample(i))
    taken, drops = live.take(10)
    assert [s.index for s in taken] == [3, 4] and drops == 3 == live.dropped
    live.finish()
    assert live.take(10) == ([], 0)

    files = SampleQueue(1, drop_oldest=False)
    assert files.put(sample(0))
    waiter = threading.Thread(target=files.put, args=(sample(1),))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # waiting for room, not dropping
    assert [s.index for s in files.take(1)[0]] == [0]
    waiter.join(2)
    assert not waiter.is_alive() and [s.index for s in files.take(1)[0]] == [1] and files.dropped == 0
    files.stop()
    assert not files.put(sample(2))  # a stopped consumer: the reader is told to end


def test_a_dead_reader_is_an_error_not_a_wait() -> None:
    queue = SampleQueue(2, drop_oldest=False)
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    with pytest.raises(RuntimeError, match="reader thread ended"):
        queue.take(1, dead)


def _skipped_after(events: list[StreamEvent], samples: int) -> int:
    """Samples after the last event, none captioned (every 0.5 s of 10 fps: sample k is frame 5k)."""
    return samples - 1 - events[-1].index // 5 if events else samples
