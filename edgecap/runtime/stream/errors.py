"""The error every frame source raises, in a module of its own so that the source modules and their dispatcher
(:mod:`edgecap.runtime.stream.sources`, which re-exports it) share it without importing each other."""

from __future__ import annotations

__all__ = ["StreamSourceError", "stopped"]


class StreamSourceError(RuntimeError):
    """A source that cannot be opened or read: the message names it (and, after good frames, the last good frame and
    its time)."""


def stopped(name: str, last_index: int, last_pts_s: float | None, reason: str) -> str:
    """The message of a source that failed after good frames: which frame was the last good one, and when."""
    if last_index < 0:
        return f"{name}: no frame could be read: {reason}"
    when = "" if last_pts_s is None else f" at {last_pts_s:.3f} s"
    return f"{name}: stopped after frame {last_index}{when}: {reason}"
