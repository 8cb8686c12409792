"""Caption a stream as it plays: a reader thread decodes, samples and preprocesses frames into a bounded queue, and the
caller's thread captions what is queued, a batch at a time.

Two threads because decoding video and running the model are different work: while the model decodes one batch of
captions, the reader already decodes and preprocesses the next frames, so neither waits for the other. The queue
between them is what a stream's kind decides:

- a file (or a folder) never loses a sample: when the queue is full the reader waits, and the stream runs as fast as
  the slower of the two (faster than real time when the model keeps up);
- a live source (a camera, RTSP/HTTP) cannot be paused: when the queue is full the OLDEST queued sample is dropped
  and counted, so what is captioned stays recent and the memory stays bounded by the queue's length.

The captioner takes up to ``max_batch`` queued samples per decode call: a caption never depends on which other images
share its batch, so batching changes the speed, not the captions. With an on-change gate, a sample is captioned only
when its pooled backbone embedding moved away from the last captioned sample's
(:class:`~edgecap.runtime.stream.sampling.ChangeGate`).

A source error after good frames ends the stream in order: the good samples' events first, then the error. An error
in the reader thread is handed to the caller's thread through the queue, so it can never leave the caller waiting;
stopping the caller (Ctrl-C, ``close()``, leaving a ``for`` loop) stops the reader.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgecap.runtime.stream.events import STAGES, StreamEvent, StreamSummary, percentile

if TYPE_CHECKING:
    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.stream.sampling import ChangeGate, Sampler
    from edgecap.runtime.stream.sources import FrameSource

__all__ = ["CaptionStream", "SampleQueue"]

#: How long the caller's thread waits for the reader at a time before checking that it is still alive; also how
#: often a blocked reader checks that the caller has not stopped.
_POLL_S = 0.1
#: How long stopping waits for the reader thread to finish its current frame (a live source's read can block).
_JOIN_S = 5.0


@dataclass
class _Sample:
    """A sampled, preprocessed frame on its way to the captioner (its timings in ``time.perf_counter`` seconds)."""

    pts_s: float
    index: int
    inputs: dict[str, np.ndarray]
    started: float
    read_s: float
    preprocess_s: float
    queued: float = 0.0


class SampleQueue:
    """The bounded hand-off between the reader thread and the captioner.

    ``drop_oldest=False`` (files): :meth:`put` waits for room. ``drop_oldest=True`` (live sources): :meth:`put` makes
    room by dropping the oldest queued sample and counts it. The end of the stream (and the reader's error) is a
    state, not an item, so it can never be dropped and never needs room.
    """

    def __init__(self, size: int, *, drop_oldest: bool) -> None:
        self.size, self.drop_oldest = size, drop_oldest
        self._items: collections.deque[_Sample] = collections.deque()
        self._cond = threading.Condition()
        self.dropped = 0
        self._dropped_taken = 0
        self.finished = False
        self.error: BaseException | None = None
        self.stopped = False
        self.high_water = 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def put(self, sample: _Sample) -> bool:
        """Queue ``sample``; False when the consumer has stopped (the reader should end)."""
        with self._cond:
            while not self.drop_oldest and len(self._items) >= self.size and not self.stopped:
                self._cond.wait(_POLL_S)
            if self.stopped:
                return False
            while len(self._items) >= self.size:
                self._items.popleft()
                self.dropped += 1
            sample.queued = time.perf_counter()
            self._items.append(sample)
            self.high_water = max(self.high_water, len(self._items))
            self._cond.notify_all()
            return True

    def finish(self, error: BaseException | None = None) -> None:
        """The reader is done: no more samples; ``error`` is raised to the consumer after the queued samples."""
        with self._cond:
            self.finished, self.error = True, error
            self._cond.notify_all()

    def stop(self) -> None:
        """The consumer is done: wake a reader waiting for room, and make every later :meth:`put` refuse."""
        with self._cond:
            self.stopped = True
            self._items.clear()
            self._cond.notify_all()

    def take(self, most: int, reader: threading.Thread | None = None) -> tuple[list[_Sample], int]:
        """Up to ``most`` queued samples (waiting for one) and the drops since the last call; ``([], drops)`` once the
        stream has finished and the queue is empty. A ``reader`` thread that died without finishing the queue (it
        cannot: :class:`CaptionStream` finishes it in a ``finally``) is an error here, never a wait forever."""
        with self._cond:
            while not self._items and not self.finished:
                self._cond.wait(_POLL_S)
                if not self._items and not self.finished and reader is not None and not reader.is_alive():
                    raise RuntimeError("the stream's reader thread ended without finishing the stream")
            taken = [self._items.popleft() for _ in range(min(most, len(self._items)))]
            drops, self._dropped_taken = self.dropped - self._dropped_taken, self.dropped
            self._cond.notify_all()
            return taken, drops


class CaptionStream(Iterator[StreamEvent]):
    """The events of one stream (:meth:`edgecap.Captioner.stream`): iterate it, then read :attr:`summary`.

    The reader thread starts on the first ``next()``. :meth:`close` (or leaving a ``with`` block) stops it and closes
    the source; iterating to the end, or an error, does the same.
    """

    def __init__(
        self,
        captioner: Captioner,
        source: FrameSource,
        *,
        sampler: Sampler,
        gate: ChangeGate | None = None,
        max_batch: int = 8,
        queue: int = 16,
        length_level: int | None = None,
    ) -> None:
        _check_settings(captioner, max_batch, queue, length_level)
        self.captioner, self.source, self.sampler, self.gate = captioner, source, sampler, gate
        self.max_batch, self.length_level = max_batch, length_level
        self.live = bool(getattr(source, "live", False))
        self.queue = SampleQueue(queue, drop_oldest=self.live)
        self.summary: StreamSummary | None = None
        self._events: Generator[StreamEvent, None, None] | None = None
        self._reader: threading.Thread | None = None
        self._frames = 0
        self._samples = 0
        self._first_pts: float | None = None
        self._last_pts: float | None = None
        self._closed = False

    # -- the caller's side ---------------------------------------------------------------------------------------------
    def __iter__(self) -> CaptionStream:
        return self

    def __next__(self) -> StreamEvent:
        if self._events is None:
            if self._closed:
                raise StopIteration
            self._events = self._run()
        return next(self._events)

    def close(self) -> None:
        """Stop the stream: the reader thread ends and the source is closed; :attr:`summary` is then set."""
        if self._events is not None:
            self._events.close()  # the generator's finally stops the reader
        elif not self._closed:
            self._close_source()
        self._closed = True

    def __enter__(self) -> CaptionStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> Generator[StreamEvent, None, None]:
        started = time.perf_counter()
        self._reader = threading.Thread(target=self._read, name=f"edgecap-stream-reader[{self.source.name}]")
        self._reader.daemon = True  # a live read blocked past _JOIN_S must not keep the process alive
        self._reader.start()
        latencies: dict[str, list[float]] = {stage: [] for stage in STAGES}
        counts = {"captioned": 0, "skipped": 0, "dropped": 0}
        pending = {"skipped": 0, "dropped": 0}
        error: BaseException | None = None
        interrupted = True
        try:
            while True:
                batch, dropped = self.queue.take(self.max_batch, self._reader)
                counts["dropped"] += dropped
                pending["dropped"] += dropped
                if not batch:
                    break
                for event in self._caption(batch, pending, counts):
                    for stage, seconds in event.latency_s.items():
                        latencies[stage].append(seconds)
                    yield event
            interrupted = False
            error = self.queue.error
            if error is not None:
                raise error
        except Exception as exc:  # the captioner's own failure (Ctrl-C and close() are interruptions, not errors)
            error = exc
            raise
        finally:
            self._stop()
            self._closed = True
            end = self._end_s()
            self.summary = StreamSummary(
                source=self.source.name,
                live=self.live,
                frames=self._frames,
                samples=self._samples,
                captioned=counts["captioned"],
                skipped=counts["skipped"],
                dropped=counts["dropped"],
                wall_s=time.perf_counter() - started,
                media_s=None if end is None or self._first_pts is None else end - self._first_pts,
                end_s=end,
                latency_p50_s=percentile(latencies["total"], 50),
                latency_p99_s=percentile(latencies["total"], 99),
                stage_p50_s={s: v for s in STAGES if (v := percentile(latencies[s], 50)) is not None},
                error=None if error is None else str(error) or type(error).__name__,
                interrupted=interrupted and error is None,
            )

    def _caption(
        self, batch: Sequence[_Sample], pending: dict[str, int], counts: dict[str, int]
    ) -> Iterator[StreamEvent]:
        """Gate and caption one batch of samples; their events, in order. ``pending`` holds the skips and drops since
        the last event: each event takes those before it."""
        taken = time.perf_counter()
        changed = [True] * len(batch)
        if self.gate is not None:
            from edgecap.runtime.stream.sampling import pooled_embedding

            embeddings = pooled_embedding(self.captioner, _concat([s.inputs for s in batch]))
            changed = [self.gate.changed(embedding) for embedding in embeddings]
        gated = time.perf_counter()
        kept: list[tuple[_Sample, int, int]] = []  # (sample, skipped before it, dropped before it)
        for sample, change in zip(batch, changed, strict=True):
            if not change:
                counts["skipped"] += 1
                pending["skipped"] += 1
                continue
            kept.append((sample, pending["skipped"], pending["dropped"]))
            pending["skipped"] = pending["dropped"] = 0
        if not kept:
            return
        inputs = _concat([sample.inputs for sample, _, _ in kept])
        captions = [reply.text for reply in self.captioner.caption(inputs, length_level=self.length_level)]
        done = time.perf_counter()
        for (sample, skipped, dropped), caption in zip(kept, captions, strict=True):
            counts["captioned"] += 1
            latency = {
                "read": sample.read_s,
                "preprocess": sample.preprocess_s,
                "queue": taken - sample.queued,
                "gate": gated - taken,
                "caption": done - gated,
                "total": done - sample.started,
            }
            yield StreamEvent(sample.pts_s, sample.index, caption, latency, skipped=skipped, dropped=dropped)

    # -- the reader thread ---------------------------------------------------------------------------------------------
    def _read(self) -> None:
        error: BaseException | None = None
        try:
            frames = iter(self.source)
            while not self.queue.stopped:
                started = time.perf_counter()
                frame = next(frames, None)
                if frame is None:
                    break
                read = time.perf_counter()
                self._frames += 1
                if self._first_pts is None:
                    self._first_pts = frame.pts_s
                self._last_pts = frame.pts_s
                if not self.sampler.take(frame):
                    continue
                self._samples += 1
                inputs = self.captioner.prepare([frame.image])
                sample = _Sample(
                    pts_s=frame.pts_s,
                    index=frame.index,
                    inputs=inputs,
                    started=started,
                    read_s=read - started,
                    preprocess_s=time.perf_counter() - read,
                )
                if not self.queue.put(sample):
                    break
        except BaseException as exc:  # handed to the caller's thread, which raises it after the good samples
            error = exc
        finally:
            try:
                self._close_source()
            except Exception as exc:  # a failing close must still finish the queue
                error = error or exc
            self.queue.finish(error)

    def _stop(self) -> None:
        self.queue.stop()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(_JOIN_S)

    def _close_source(self) -> None:
        close = getattr(self.source, "close", None)
        if close is not None:
            close()

    def _end_s(self) -> float | None:
        if self._last_pts is None:
            return None
        fps = getattr(self.source, "fps", None)
        return self._last_pts + (1.0 / fps if fps else 0.0)


def _concat(inputs: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(inputs) == 1:
        return dict(inputs[0])
    return {name: np.concatenate([one[name] for one in inputs], axis=0) for name in inputs[0]}


def open_stream(
    captioner: Captioner,
    source: Any,
    *,
    every: float | None = None,
    fps: float | None = None,
    on_change: float | None = None,
    max_batch: int = 8,
    queue: int = 16,
    length_level: int | None = None,
) -> CaptionStream:
    """:meth:`edgecap.Captioner.stream`: the settings checked before the source is opened, then the stream (not yet
    started: the reader begins on the first ``next()``)."""
    from edgecap.runtime.stream.sampling import ChangeGate, Sampler
    from edgecap.runtime.stream.sources import open_source

    _check_settings(captioner, max_batch, queue, length_level)
    sampler = Sampler(every_s=every, fps=fps)
    gate = None if on_change is None else ChangeGate(on_change)
    opened = source if _is_frame_source(source) else open_source(source)
    try:
        return CaptionStream(
            captioner, opened, sampler=sampler, gate=gate, max_batch=max_batch, queue=queue, length_level=length_level
        )
    except BaseException:
        if opened is not source:
            opened.close()
        raise


def _check_settings(captioner: Captioner, max_batch: int, queue: int, length_level: int | None) -> None:
    from edgecap.runtime.backends.registry import CaptionerError

    for name, value in (("max_batch", max_batch), ("queue", queue)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CaptionerError(f"{name} must be an integer >= 1, got {value!r}")
    if captioner.inputs is None:
        raise CaptionerError(captioner.no_images_reason)
    captioner.check_options(length_level=length_level)  # a level the model cannot take: before the source opens


def _is_frame_source(source: Any) -> bool:
    """An opened source (a :class:`~edgecap.runtime.stream.sources.FrameSource`) rather than a spec to open."""
    from edgecap.runtime.stream.sources import FrameSource

    return not isinstance(source, (str, bytes, os.PathLike)) and isinstance(source, FrameSource)
