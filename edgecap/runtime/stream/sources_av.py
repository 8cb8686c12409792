"""Video files, network streams and V4L2 cameras through PyAV (FFmpeg): the frames with their own timestamps, and
FFmpeg's failures as :class:`~edgecap.runtime.stream.sources.StreamSourceError` s that name the source.

FFmpeg is lenient: a truncated Matroska file or a damaged MP4 often just ends early, with no error. A file is a
recording whose length its header states, so after the last frame a file source compares what it decoded with the
frame count the container states (MP4), or else with its duration by the frames' timestamps
(:mod:`~edgecap.runtime.stream.timeline`: a variable frame rate is not damage), and an early end is an error like any
other: the frames before it were yielded, and the caller learns the recording was cut instead of silently captioning
half of it. Packets are
demuxed and decoded one by one, and after FFmpeg's first error the decoder is drained, so the frames it held back
(reordered B-frames, frame threads) are yielded before the error too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from edgecap.runtime.stream.errors import StreamSourceError, stopped
from edgecap.runtime.stream.frames import Frame
from edgecap.runtime.stream.timeline import Timeline

__all__ = ["AvSource", "open_av"]

_INSTALL = "reading video needs PyAV (FFmpeg): pip install 'edgecap[stream]'"


def _av() -> Any:
    try:
        import av
    except ImportError:
        return None
    return av


def open_av(spec: str, *, kind: Literal["file", "url", "camera"], live: bool, timeout_s: float) -> AvSource:
    """Open ``spec`` with FFmpeg: a file, a network URL (``timeout_s`` to open and per read) or a V4L2 camera."""
    av = _av()
    if av is None:
        raise StreamSourceError(f"{spec}: {_INSTALL}")
    if kind == "camera" and not Path(spec).exists():
        raise StreamSourceError(f"{spec}: no such camera (is it connected? the cameras here: ls /dev/video*)")
    options: dict[str, Any] = {}
    if kind == "camera":
        options["format"] = "v4l2"
    if kind != "file":
        options["timeout"] = (timeout_s, timeout_s)
    started = time.monotonic()
    try:
        container = av.open(spec, mode="r", **options)
    except (av.error.TimeoutError, av.error.ExitError):  # ExitError: FFmpeg's call interrupted by PyAV's timeout
        raise StreamSourceError(f"{spec}: no answer within {timeout_s:g} s") from None
    except av.error.ConnectionRefusedError:
        raise StreamSourceError(f"{spec}: does not answer (connection refused)") from None
    except av.error.InvalidDataError:
        if kind != "file" and time.monotonic() - started >= timeout_s:  # RTSP reports its timeout as bad data
            raise StreamSourceError(f"{spec}: no answer within {timeout_s:g} s") from None
        what = "a video FFmpeg reads (or damaged before its first frame)" if kind == "file" else "sending video"
        raise StreamSourceError(f"{spec}: not {what}") from None
    except (av.error.FFmpegError, OSError) as exc:
        raise StreamSourceError(f"{spec}: cannot open: {_reason(exc)}") from None
    try:
        return AvSource(spec, container, kind=kind, live=live, timeout_s=timeout_s)
    except BaseException:
        container.close()
        raise


class AvSource:
    """The first video stream of an opened PyAV container.

    ``pts_s``: a file's presentation time from its start (a player's clock, which an MPEG-TS file's start offset does
    not move); a live source's from its first frame (the camera's clock, or the arrival time when frames carry none).
    """

    def __init__(self, name: str, container: Any, *, kind: str, live: bool, timeout_s: float | None = None) -> None:
        self.name, self.kind, self.live, self._container = name, kind, live, container
        self.timeout_s = timeout_s
        if not container.streams.video:
            raise StreamSourceError(f"{name}: has no video stream")
        self._stream = stream = container.streams.video[0]
        if stream.codec_context is None or not getattr(stream.codec_context, "name", None):
            raise StreamSourceError(f"{name}: unsupported video codec (FFmpeg has no decoder for it)")
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        self.fps: float | None = float(rate) if rate else None
        start = container.start_time  # microseconds, or None
        self._origin: float | None = None if live else (start / 1e6 if start is not None else 0.0)
        self._closed = False
        self._iterating = False
        self._reordered = False  # a packet came after one shown later (B-frames): a cut can lose frames shown earlier

    def __iter__(self) -> Iterator[Frame]:
        if self._closed:
            return
        self._iterating = True
        try:
            yield from self._decode()
        finally:
            self._iterating = False
            if self._closed:  # close() came while a frame was out: the container is closed here, after decode
                self._container.close()

    def _decode(self) -> Iterator[Frame]:
        import av

        index, pts_s = -1, None
        started = time.monotonic()
        timeline = Timeline(self.fps)
        failure: BaseException | None = None
        for decoded in self._frames(av):
            if isinstance(decoded, BaseException):
                failure = decoded
                continue  # the decoder's buffered frames, flushed after the failure, still come first
            image = decoded.to_ndarray(format="rgb24")
            index += 1
            pts_s = self._pts(self._seconds(decoded), index, started)
            timeline.add(pts_s)
            yield Frame(image=image, pts_s=pts_s, index=index)
            if self._closed:
                return
        if self._closed:
            return
        if failure is not None:
            reason = _reason(failure)
            if isinstance(failure, (av.error.TimeoutError, av.error.ExitError)) and self.timeout_s is not None:
                reason = f"no frame within {self.timeout_s:g} s"
            raise StreamSourceError(stopped(self.name, index, pts_s, reason)) from None
        if self.kind == "file":
            short = self._cut_short(index + 1, timeline)
            if short:
                raise StreamSourceError(stopped(self.name, index, pts_s, short))

    def _frames(self, av: Any) -> Iterator[Any]:
        """The decoded frames, packet by packet; on FFmpeg's first failure (demuxing or decoding) that failure, then
        the frames the decoder still holds. ``container.decode()`` would drop those: a decoder that reorders frames
        (H.264 with B-frames) or decodes on several threads keeps some back, and they are good frames before the cut.
        """
        failure: BaseException | None = None
        latest = None
        try:
            for packet in self._container.demux(self._stream):
                if self._closed:
                    return
                if packet.size == 0:  # the demuxer's end-of-stream marker: the decoder is drained below
                    continue
                if packet.pts is not None:
                    self._reordered = self._reordered or (latest is not None and packet.pts < latest)
                    latest = packet.pts if latest is None else max(latest, packet.pts)
                try:
                    yield from packet.decode()
                except av.error.FFmpegError as exc:
                    failure = exc
                    break
        except av.error.FFmpegError as exc:
            failure = exc
        if self._closed:
            return
        if failure is not None:
            yield failure
        try:
            yield from self._stream.codec_context.decode(None)
        except av.error.FFmpegError as exc:
            if failure is None:
                yield exc

    def _seconds(self, decoded: Any) -> float | None:
        """A frame's timestamp on the stream's clock (a frame drained from the decoder carries no time base)."""
        base = self._stream.time_base
        return None if decoded.pts is None or base is None else float(decoded.pts * base)

    def _pts(self, seconds: float | None, index: int, started: float) -> float:
        if seconds is None:  # no timestamp: a file's frame rate, a live source's arrival time
            return time.monotonic() - started if self.live or not self.fps else index / self.fps
        if self._origin is None:
            self._origin = seconds
        return float(seconds) - self._origin

    def _cut_short(self, decoded: int, timeline: Timeline) -> str:
        """Why a file that ended cleanly is still truncated ("" when it is whole): fewer frames than its header
        counts, or (without a count) what its timestamps say against the duration it announced."""
        expected = int(self._stream.frames or 0)
        if expected:
            if decoded < expected:
                return f"truncated or damaged: the file ends after {decoded} of its {expected} frames"
            return ""
        duration = None
        if self._stream.duration is not None and self._stream.time_base is not None:
            duration = float(self._stream.duration * self._stream.time_base)
        elif self._container.duration is not None and len(self._container.streams) == 1:
            duration = self._container.duration / 1e6  # the container's duration is the video's when it is alone
        return timeline.cut_short(duration, reordered=self._reordered)

    def close(self) -> None:
        """Stop the frames; the container is closed now, or by the iteration once its current frame is handed over
        (FFmpeg must not free a container a suspended decode still uses)."""
        if not self._closed:
            self._closed = True
            if not self._iterating:
                self._container.close()


def _reason(exc: BaseException) -> str:
    """FFmpeg's reason without PyAV's errno prefix and file name."""
    text = getattr(exc, "strerror", None) or str(exc)
    return str(text).strip() or type(exc).__name__
