"""What a captioning stream hands its caller: one :class:`StreamEvent` per captioned sample, and a
:class:`StreamSummary` at the end.

Each event carries the latency of every stage it went through, so a slow stream says where its time goes (decoding,
preprocessing, waiting in the queue, the on-change gate, the decoder), and the samples the stream did not caption
since the previous event (skipped by the on-change gate, dropped by a live source's full queue), so a subtitle or a
JSONL log shows the gaps instead of hiding them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["STAGES", "StreamEvent", "StreamSummary", "percentile"]

#: The stages of ``StreamEvent.latency_s``, in pipeline order. ``read``: the source handing over the frame (decoding;
#: a live source's wait for its next frame included); ``preprocess``: the frame to encoder inputs; ``queue``: waiting
#: for the captioner; ``gate``: the on-change embedding and comparison (0 without ``on_change``); ``caption``: the
#: decode call of the batch the sample was in; ``total``: from the start of the read to the caption.
STAGES = ("read", "preprocess", "queue", "gate", "caption", "total")


@dataclass
class StreamEvent:
    """One captioned sample.

    Attributes:
        pts_s: the frame's timestamp in the stream (seconds; a live source's capture time since the stream began).
        index: the frame's index in the source (every frame counts, sampled or not).
        caption: the caption.
        latency_s: seconds per stage (:data:`STAGES`).
        skipped: samples the on-change gate left uncaptioned since the previous event (they showed nothing new).
        dropped: samples a live source's full queue dropped since the previous event (the captioner fell behind).
    """

    pts_s: float
    index: int
    caption: str
    latency_s: dict[str, float] = field(default_factory=dict)
    skipped: int = 0
    dropped: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StreamSummary:
    """A whole stream, once it ended (or stopped).

    Attributes:
        source: the source's name.
        live: a camera or network stream (drops allowed) rather than a file or a folder (never drops).
        frames: frames read from the source.
        samples: frames the sampler took (captioned + skipped + dropped, plus any left queued when it stopped).
        captioned: samples captioned (one event each).
        skipped: samples the on-change gate skipped.
        dropped: samples a live source's full queue dropped.
        wall_s: seconds from the start of reading to the end.
        media_s: seconds of stream read (the span of the frames' timestamps plus one frame); None when unknown.
        end_s: where the stream read ends on its own clock (the last frame's timestamp plus one frame): the end of
            the last subtitle cue; None before any frame.
        latency_p50_s: median frame-to-caption latency (``total``) of the captioned samples; None without any.
        latency_p99_s: its 99th percentile.
        stage_p50_s: the median of every stage (:data:`STAGES`).
        error: why the stream stopped early (a source error), else None.
        interrupted: the caller stopped the stream before its end (Ctrl-C, ``close()``).
    """

    source: str
    live: bool
    frames: int
    samples: int
    captioned: int
    skipped: int
    dropped: int
    wall_s: float
    media_s: float | None
    end_s: float | None
    latency_p50_s: float | None
    latency_p99_s: float | None
    stage_p50_s: dict[str, float]
    error: str | None = None
    interrupted: bool = False

    @property
    def captioned_per_s(self) -> float:
        """Captioned samples per wall-clock second."""
        return self.captioned / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        """Samples handled (captioned or skipped) per wall-clock second."""
        return (self.captioned + self.skipped) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def real_time_factor(self) -> float | None:
        """Seconds of stream per second of wall clock (>= 1: faster than it plays); files only (a live source plays
        at its own pace, whatever the captioner does)."""
        if self.live or self.media_s is None or self.wall_s <= 0:
            return None
        return self.media_s / self.wall_s

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            captioned_per_s=self.captioned_per_s,
            samples_per_s=self.samples_per_s,
            real_time_factor=self.real_time_factor,
        )
        return out

    def describe(self) -> str:
        """A few human lines: counts, speed, latency, and how it ended."""
        lines = [
            f"{self.source}: {self.frames} frame(s) read, {self.samples} sample(s): {self.captioned} captioned, "
            f"{self.skipped} skipped (on-change), {self.dropped} dropped (queue full)"
        ]
        speed = f"{self.wall_s:.2f} s wall, {self.captioned_per_s:.2f} captioned/s, {self.samples_per_s:.2f} samples/s"
        rtf = self.real_time_factor
        if rtf is not None and self.media_s is not None:
            speed += f", {self.media_s:.2f} s of media: {rtf:.2f}x real time"
        lines.append(speed)
        if self.latency_p50_s is not None and self.latency_p99_s is not None:
            stages = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in self.stage_p50_s.items() if k != "total")
            lines.append(
                f"frame-to-caption latency p50 {self.latency_p50_s * 1e3:.0f} ms, p99 {self.latency_p99_s * 1e3:.0f} "
                f"ms (median per stage, ms: {stages})"
            )
        if self.error:
            lines.append(f"stopped by a source error: {self.error}")
        elif self.interrupted:
            lines.append("interrupted before the end of the stream")
        return "\n".join(lines)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100, linear interpolation, as numpy's default) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
