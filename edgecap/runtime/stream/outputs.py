"""Where a stream's captions go: WebVTT and SRT subtitles, a JSONL log, and a status line on the terminal.

Every writer hands each cue or line to the operating system as soon as it is complete, in one write, so a run that
is killed (a power cut aside) leaves a valid file up to its last completed cue. A subtitle cue runs from its
caption's timestamp until the next caption's, so a cue is written when the next caption arrives, or at
:meth:`close`: the last caption of a killed run has no cue, since its end was never known.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import IO, Any, Protocol

__all__ = ["JsonlWriter", "SrtWriter", "StatusLine", "WebVttWriter", "srt_time", "vtt_time"]

#: How long the last cue lasts when neither the stream's end nor a sample period is known (seconds).
DEFAULT_LAST_CUE_S = 1.0


class _Event(Protocol):
    """What the writers read of a :class:`~edgecap.runtime.stream.events.StreamEvent`."""

    pts_s: float
    index: int
    caption: str
    latency_s: dict[str, float]
    skipped: int
    dropped: int


class _AppendFile:
    """A file written only in whole records: one ``os.write`` loop per record, no buffer left behind by a kill."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)

    def write(self, text: str) -> None:
        if self._fd is None:
            raise ValueError(f"{self.path}: written after close")
        data = memoryview(text.encode("utf-8"))
        while data:
            data = data[os.write(self._fd, data) :]

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


class _SubtitleWriter(ABC):
    """A cue per caption, from its timestamp to the next caption's; held back until that next caption (or close)."""

    header = ""

    def __init__(self, path: str | os.PathLike[str], *, period_s: float | None = None) -> None:
        """``period_s``: the sampling period, how long the last cue runs when :meth:`close` is given no end."""
        self.path = Path(path)
        self.period_s = period_s
        self._file = _AppendFile(path)
        self._pending: tuple[float, str] | None = None
        self._gap: float | None = None
        self.cues = 0
        if self.header:
            self._file.write(self.header)

    def write(self, event: _Event) -> None:
        """Add ``event``'s caption; the previous caption's cue, now that its end is known, goes to the file."""
        if self._pending is not None:
            start = self._pending[0]
            self._gap = event.pts_s - start if event.pts_s > start else self._gap
            self._emit(event.pts_s)
        self._pending = (float(event.pts_s), event.caption)

    def close(self, end_s: float | None = None) -> None:
        """Write the last cue, ending at ``end_s`` (the stream's end) or one sample period after it starts, and close
        the file."""
        try:
            if self._pending is not None:
                start = self._pending[0]
                if end_s is None or end_s <= start:
                    end_s = start + (self.period_s or self._gap or DEFAULT_LAST_CUE_S)
                self._emit(end_s)
        finally:
            self._file.close()

    def _emit(self, end_s: float) -> None:
        assert self._pending is not None
        start, caption = self._pending
        self._pending = None
        self.cues += 1
        start_ms = _ms(start)  # a cue ends after it starts, even for two captions at one timestamp
        self._file.write(self._cue(self.cues, start_ms, max(_ms(end_s), start_ms + 1), caption))

    @abstractmethod
    def _cue(self, number: int, start_ms: int, end_ms: int, caption: str) -> str:
        """The cue's text, blank line included."""

    def __enter__(self) -> _SubtitleWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WebVttWriter(_SubtitleWriter):
    """WebVTT (``.vtt``): what browsers' ``<track>`` and most players read."""

    header = "WEBVTT\n\n"

    def _cue(self, number: int, start_ms: int, end_ms: int, caption: str) -> str:
        text = _one_line(caption).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return f"{number}\n{vtt_time(start_ms / 1000)} --> {vtt_time(end_ms / 1000)}\n{text}\n\n"


class SrtWriter(_SubtitleWriter):
    """SubRip (``.srt``): the subtitle format every player and editor reads."""

    def _cue(self, number: int, start_ms: int, end_ms: int, caption: str) -> str:
        return f"{number}\n{srt_time(start_ms / 1000)} --> {srt_time(end_ms / 1000)}\n{_one_line(caption)}\n\n"


class JsonlWriter:
    """One JSON object per caption and line: ``pts_s``, ``index``, ``caption``, ``latency_s`` (seconds per stage),
    ``skipped`` and ``dropped`` (samples not captioned since the previous line), written as each caption comes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file = _AppendFile(path)
        self.lines = 0

    def write(self, event: _Event) -> None:
        record: dict[str, Any] = {
            "pts_s": round(float(event.pts_s), 6),
            "index": int(event.index),
            "caption": event.caption,
            "latency_s": {stage: round(float(s), 6) for stage, s in event.latency_s.items()},
            "skipped": int(event.skipped),
            "dropped": int(event.dropped),
        }
        self._file.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        self.lines += 1

    def close(self, end_s: float | None = None) -> None:
        """Close the file (``end_s`` is accepted for symmetry with the subtitle writers; every line is written)."""
        self._file.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StatusLine:
    """One line of progress on a terminal, rewritten in place (``\\r``); silent when ``stream`` is not a TTY, so
    logs and pipes get only the captions."""

    def __init__(self, stream: IO[str] | None = None, *, enabled: bool | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(isatty and isatty()) if enabled is None else enabled
        self._width = 0

    def update(self, text: str) -> None:
        """Show ``text`` (cut to the terminal's width) in place of the previous status."""
        if not self.enabled:
            return
        columns = shutil.get_terminal_size((80, 24)).columns - 1
        text = _one_line(text)[: max(columns, 1)]
        self.stream.write("\r" + text + " " * max(self._width - len(text), 0))
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        """Erase the status (before printing a normal line, and at the end)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


def vtt_time(seconds: float) -> str:
    """``HH:MM:SS.mmm``."""
    h, m, s, ms = _split(seconds)
    return f"{h:02d}:{m:02d}:{s:02d}.{ms:03d}"


def srt_time(seconds: float) -> str:
    """``HH:MM:SS,mmm``."""
    h, m, s, ms = _split(seconds)
    return f"{h:02d}:{m:02d}:{s:02d},{ms:03d}"


def _ms(seconds: float) -> int:
    return max(round(seconds * 1000), 0)


def _split(seconds: float) -> tuple[int, int, int, int]:
    total = _ms(seconds)
    return total // 3_600_000, total // 60_000 % 60, total // 1000 % 60, total % 1000


def _one_line(text: str) -> str:
    """A caption as one cue line: no line breaks (a blank line ends a cue) and no ``-->`` (it starts a timing)."""
    return " ".join(text.split()).replace("-->", "->")
