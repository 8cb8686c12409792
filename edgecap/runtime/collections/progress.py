"""The progress line of a collection run on stderr: done/total, images/s and an ETA.

The runtime half has no rich (a ``[train]`` package), so this draws one line itself: redrawn in place on a terminal
(at most a few times a second), or a plain line every :data:`LOG_SECONDS` when stderr is a file or a pipe (a log
keeps a record, not thousands of carriage returns).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["LOG_SECONDS", "Progress", "format_duration"]

#: Seconds between two progress lines when stderr is not a terminal.
LOG_SECONDS = 30.0
_TTY_SECONDS = 0.25


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


class Progress:
    """Counts captioned images against ``total``; the rate counts from :meth:`start` (after the workers loaded)."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total, self.done, self.errors = total, 0, 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._start = self._drawn = time.monotonic()

    def start(self) -> None:
        self._start = self._drawn = time.monotonic()

    def rate(self) -> float:
        elapsed = time.monotonic() - self._start
        return self.done / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        rate = self.rate()
        left = self.total - self.done
        eta = format_duration(left / rate) if rate > 0 else "?"
        share = f" {100 * self.done / self.total:5.1f}%" if self.total else ""
        errors = f", {self.errors:,} bad" if self.errors else ""
        return f"captioned {self.done:,}/{self.total:,}{share}{errors} · {rate:.1f} images/s · ETA {eta}"

    def update(self, images: int, errors: int = 0) -> None:
        self.done += images
        self.errors += errors
        now = time.monotonic()
        if self.enabled and now - self._drawn >= (_TTY_SECONDS if self._tty else LOG_SECONDS):
            self._drawn = now
            self._draw()

    def _draw(self) -> None:
        if self._tty:
            self.stream.write("\r" + self.line() + "\x1b[K")
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        """The final count, and the end of the redrawn line."""
        if self.enabled:
            self._draw()
            if self._tty:
                self.stream.write("\n")
                self.stream.flush()
