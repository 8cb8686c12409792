"""Atomic writes of the tools' and research studies' outputs: a reader never sees half a file, and a killed run
leaves the last whole one (or none)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "write_bytes", "write_json", "write_text"]


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed onto ``path`` (mode 0644: an output is not private,
    as ``mkstemp`` would make it) when the block ends, removed when it raises."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.resolve().parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        tmp.chmod(0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: str | Path, data: bytes) -> None:
    """``data`` into ``path``, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | Path, text: str) -> None:
    """``text`` (UTF-8) into ``path``, atomically."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any, *, indent: int = 2, default: Callable[[Any], Any] | None = None) -> None:
    """``obj`` as JSON into ``path``, atomically (``default``: as in :func:`json.dumps`, for what JSON cannot hold)."""
    write_text(path, json.dumps(obj, indent=indent, default=default) + "\n")
