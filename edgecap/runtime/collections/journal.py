"""The JSONL output of a collection run: appended atomically, one writer at a time, resumable after a kill.

One line per image, keys in this order (the record format ``edgecap caption --out`` and the Ray path share)::

    {"path":"photos/a.jpg","caption":"a dog on a beach"}
    {"path":"photos/b.jpg","error":"photos/b.jpg: cannot identify image file"}

Lines are UTF-8 (``ensure_ascii=False``; a path that is not valid UTF-8 is written with ``\\udcXX`` escapes, which
``json.loads`` and ``os.fsencode`` turn back into its bytes). A chunk of lines goes to the file in one ``os.write`` on
an ``O_APPEND`` descriptor, so lines are never interleaved; a writer killed mid-write leaves at most a partial last
line, which :meth:`Journal.open` cuts off when resuming. The file is ``flock``-ed while written: a second writer
fails at once instead of interleaving its lines, and the lock dies with its process (no stale lock files).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from edgecap.runtime._io import check_output_location

__all__ = ["FSYNC_SECONDS", "Journal", "JournalError", "record_line"]

#: At most this long between two fsyncs while lines are appended (and one at close): a machine that loses power
#: loses at most this much work, and the tail it leaves is cut off on resume like a killed writer's.
FSYNC_SECONDS = 10.0

_TAIL_BLOCK = 64 * 1024


class JournalError(ValueError):
    """An output that cannot be written or resumed (exists without resume, busy, unreadable, not a journal)."""


def record_line(path: str, caption: str | None = None, error: str | None = None) -> bytes:
    """One journal line (newline included): the caption of ``path``, or why it has none."""
    record: dict[str, Any] = {"path": path}
    if error is not None:
        record["error"] = " ".join(error.split())  # one line, whatever the exception said
    else:
        record["caption"] = caption
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:  # a file name that is not UTF-8 (surrogate escapes): JSON escapes keep it exact
        return json.dumps(record, separators=(",", ":")).encode("ascii") + b"\n"


def _last_line(fd: int, size: int) -> tuple[bytes | None, int]:
    """The last complete line of the file (without its newline) and where complete lines end (the size to keep)."""
    end = size
    tail = b""
    while end > 0:  # read backwards until the last newline, then until the one before it
        start = max(0, end - _TAIL_BLOCK)
        tail = os.pread(fd, end - start, start) + tail
        end = start
        last_nl = tail.rfind(b"\n")
        if last_nl < 0:
            continue
        keep = end + last_nl + 1
        before = tail.rfind(b"\n", 0, last_nl)
        if before >= 0 or end == 0:
            return tail[before + 1 : last_nl], keep
    return None, 0


class Journal:
    """An open journal: :meth:`append` lines, :meth:`close` when done. :attr:`last_path` is the path of the last
    line already in the file when it was opened (None for a new or empty one)."""

    def __init__(self, path: Path, fd: int, created: bool, last_path: str | None, truncated: int) -> None:
        self.path, self.created, self.last_path = path, created, last_path
        self.truncated = truncated  #: bytes of a partial last line cut off when it was opened
        self.lines_written = 0  #: lines appended since it was opened
        self._fd: int | None = fd
        self._synced = time.monotonic()

    @classmethod
    def open(cls, path: str | os.PathLike, resume: bool = False) -> Journal:
        """Open ``path`` for appending, before any work: a new file, or an existing one when ``resume``.

        Raises:
            JournalError: ``path`` exists without ``resume``; another process is writing it; it cannot be created
                or written; its last complete line is not a journal record.
        """
        path = Path(path)
        if path.is_dir():
            raise JournalError(f"{path} is a directory; --out names the JSONL file to write")
        if path.exists() and not resume:
            raise JournalError(f"{path} already exists: pass --resume to continue it (or choose another --out)")
        try:
            check_output_location(path.parent, existing="into", what="--out", reserve=0)
        except (OSError, ValueError) as exc:  # a read-only place, a file in the way, a name too long
            raise JournalError(str(exc)) from None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
            created = not path.exists()
            fd = os.open(path, flags | os.O_CREAT | (os.O_EXCL if created else 0), 0o666)
        except FileExistsError:
            raise JournalError(f"{path} appeared while opening it: another process is writing it") from None
        except (OSError, ValueError) as exc:
            raise JournalError(f"cannot write {path}: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise JournalError(f"{path} is being written by another process; wait for it to finish") from None
            raise JournalError(f"cannot lock {path}: {exc.strerror or exc}") from None
        try:
            last, cut = cls._recover(path, fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, created, last, cut)

    @staticmethod
    def _recover(path: Path, fd: int) -> tuple[str | None, int]:
        """Cut a partial last line off (a writer killed mid-line) and read the last complete line's path."""
        size = os.fstat(fd).st_size
        if size == 0:
            return None, 0
        try:
            reader = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise JournalError(f"cannot read {path} to resume it: {exc.strerror or exc}") from None
        try:
            line, keep = _last_line(reader, size)
        finally:
            os.close(reader)
        if keep < size:
            os.ftruncate(fd, keep)
            os.fsync(fd)
        if line is None:
            return None, size - keep
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("path"), str):
            raise JournalError(f"{path} does not end with a caption record ({line[:60]!r}): not an output to resume")
        return record["path"], size - keep

    def append(self, data: bytes) -> None:
        """Append whole lines (``data`` ends with a newline) in one write: a reader sees all of them or none."""
        if self._fd is None:
            raise JournalError(f"{self.path} is closed")
        if data and not data.endswith(b"\n"):
            raise ValueError("a journal takes whole lines: data must end with a newline")
        view = memoryview(data)
        while view:  # a regular file takes the whole write unless the disk is full (then OSError)
            view = view[os.write(self._fd, view) :]
        self.lines_written += data.count(b"\n")
        if time.monotonic() - self._synced >= FSYNC_SECONDS:
            self.sync()

    def sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            self._synced = time.monotonic()

    def close(self, discard_if_empty: bool = False) -> None:
        """fsync and close (releasing the lock). ``discard_if_empty``: remove a file this journal created and never
        wrote to (a run that failed before its first line leaves nothing behind to refuse the next one)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if discard_if_empty and self.created and self.lines_written == 0:
                self.path.unlink(missing_ok=True)  # still locked: no other writer can have taken it meanwhile
            else:
                os.fsync(fd)
        finally:
            os.close(fd)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self.close(discard_if_empty=exc is not None)
