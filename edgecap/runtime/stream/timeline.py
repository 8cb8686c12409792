"""Whether a video file that FFmpeg read to its end without an error was still cut short, judged by timestamps.

A container's frame count is exact where it states one (MP4), but Matroska states none, and its frame rate is often
only a guess: a variable-frame-rate recording (a phone's, a screen capture's) has gaps of many sizes, so "duration ×
rate" frames says nothing about how many it holds. What a cut does leave in the timestamps:

- the video ends before the duration the container announced (by more than the longest gap between its frames, which
  is how long its last frame may legitimately last, and two periods of slack);
- or, in a stream whose decoder reorders frames (B-frames), the cut lost frames shown before the last frame decoded:
  a hole near the end of a timeline that was perfectly regular until then, in a video that ends before its duration.

A variable frame rate is none of these: its gaps are spread through the timeline, not only at its end.
"""

from __future__ import annotations

import collections

__all__ = ["TRUNCATION_SLACK_S", "Timeline"]

#: How much shorter than announced a file may end (beyond two frame periods, or its longest gap between frames)
#: before it counts as truncated: container durations are rounded, and the last frame's own duration is not always
#: in them.
TRUNCATION_SLACK_S = 0.1
#: How many of the last frames a reordering decoder can have lost to a cut (B-frames shown before the last frame
#: decoded); the timeline before them must be regular for a hole among them to count as a loss.
TAIL_FRAMES = 16
#: How far from one frame period a gap may be and still count as one period (timestamps are rounded to the time base).
REGULAR_TOLERANCE = 0.25


class Timeline:
    """The presentation times of a file's decoded frames (in display order), kept as the counts a truncation check
    needs: the largest gap, whether the gaps before the last :data:`TAIL_FRAMES` were all one period, and the tail."""

    def __init__(self, fps: float | None) -> None:
        self.period = 1.0 / fps if fps else None
        self.last: float | None = None
        self.largest_gap = 0.0
        self.regular = True
        self._tail: collections.deque[float] = collections.deque(maxlen=TAIL_FRAMES)

    def add(self, pts_s: float) -> None:
        if self.last is not None:
            gap = pts_s - self.last
            self.largest_gap = max(self.largest_gap, gap)
            if len(self._tail) == self._tail.maxlen:  # the oldest tail gap joins the body
                self.regular = self.regular and self._one_period(self._tail[0])
            self._tail.append(gap)
        self.last = pts_s

    def _one_period(self, gap: float) -> bool:
        return self.period is not None and abs(gap - self.period) <= REGULAR_TOLERANCE * self.period

    def cut_short(self, duration_s: float | None, *, reordered: bool) -> str:
        """Why the file whose container announced ``duration_s`` was cut ("" when nothing says so); ``reordered``:
        its decoder reordered frames (a packet came after one shown later), so a cut can lose frames before the last
        one shown."""
        if duration_s is None or self.period is None:
            return ""
        end = 0.0 if self.last is None else self.last + self.period
        allowed = max(2 * self.period, self.largest_gap) + TRUNCATION_SLACK_S
        if end < duration_s - allowed:
            return f"truncated or damaged: the video ends at {end:.3f} s of the {duration_s:.3f} s it announces"
        if not (reordered and self.regular) or end > duration_s - self.period / 2:
            return ""
        missing = sum(max(round(gap / self.period) - 1, 0) for gap in self._tail)
        if missing:
            return (
                f"truncated or damaged: {missing} frame{'s' if missing > 1 else ''} missing before the last one "
                f"(at {self.last:.3f} s), and the video ends at {end:.3f} s of the {duration_s:.3f} s it announces"
            )
        return ""
