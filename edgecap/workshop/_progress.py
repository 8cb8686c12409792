"""One progress bar for every long loop (feature extraction, calibration, export): rich, on stderr, transient."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["ProgressBar", "track"]

T = TypeVar("T")


class ProgressBar:
    """A rich progress bar with a ``tqdm``-like surface (``update(n)``, ``close()``, a context manager).

    Args:
        total: the expected count, or None for an open-ended bar.
        desc: the label left of the bar.
        enabled: False makes every method a no-op (``--quiet``, tests).
        initial: work already done (a resumed cache).
    """

    def __init__(self, total: int | None, desc: str, *, enabled: bool = True, initial: int = 0) -> None:
        self._progress: Any = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[postfix]}"),
            console=Console(stderr=True),
            transient=True,
        )
        self._task = self._progress.add_task(desc, total=total, completed=initial, postfix="")
        self._progress.start()

    def update(self, n: int = 1) -> None:
        """Count ``n`` more done."""
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def postfix(self, **fields: object) -> None:
        """Show ``key=value`` pairs after the bar (the latest loss, learning rate…)."""
        if self._progress is not None:
            self._progress.update(self._task, postfix=" ".join(f"{k}={v}" for k, v in fields.items()))

    def close(self) -> None:
        """Remove the bar (idempotent)."""
        progress, self._progress = self._progress, None
        if progress is not None:
            progress.stop()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def track(items: Iterable[T], desc: str, *, total: int | None = None, enabled: bool = True) -> Iterator[T]:
    """Iterate ``items`` with a :class:`ProgressBar` (``total`` defaults to ``len(items)`` when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with ProgressBar(total, desc, enabled=enabled) as bar:
        for item in items:
            yield item
            bar.update()
