"""The progress display of ``edgecap bench``: a rich bar, plain lines, or nothing."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["ProgressBar"]


class ProgressBar:
    """Progress over units of work (quality runs and timing runs): a rich bar when rich is installed (``[train]``),
    else one line per finished unit on stderr (a runtime-only install), or nothing."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self._progress: Any = None
        self._task: Any = None
        self._plain = False
        self._done = 0

    def __enter__(self) -> ProgressBar:
        if not (self.enabled and self.total):
            return self
        try:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        except ImportError:
            self._plain = True
            return self
        self._progress = Progress(
            TextColumn("[bold]bench[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task("starting", total=self.total)
        return self

    def __call__(self, event: str, label: str) -> None:
        if self._plain and event == "done":
            self._done += 1
            print(f"bench [{self._done}/{self.total}] {label}", file=sys.stderr, flush=True)
        if self._progress is None:
            return
        if event == "start":
            self._progress.update(self._task, description=label)
        elif event == "done":
            self._progress.advance(self._task)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
