"""What an export prints on stderr: one numbered line per stage, notes, warnings and progress bars (rich)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("edgecap.workshop.export.bundle")

__all__ = ["Stages", "progress_bar"]


class Stages:
    """One line per stage on stderr (quiet when ``enabled`` is False); every line also goes to the log."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self._console: Any = None
        if enabled:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False, soft_wrap=True)

    def __call__(self, text: str) -> None:
        self.done += 1
        log.info("export %d/%d: %s", self.done, self.total, text)
        if self._console is not None:
            self._console.print(f"[bold]{self.done}/{self.total}[/] {text}")

    def note(self, text: str) -> None:
        log.info("export: %s", text)
        if self._console is not None:
            self._console.print(f"    {text}")

    def warn(self, text: str) -> None:
        log.warning("export: %s", text)
        if self._console is not None:
            self._console.print(f"    [yellow]warning:[/] {text}")


@contextlib.contextmanager
def progress_bar(total: int, desc: str, enabled: bool) -> Iterator[Callable[[int], None] | None]:
    """A transient rich progress bar on stderr; yields ``advance(n)``, or None when disabled."""
    if not enabled:
        yield None
        return
    from edgecap.workshop._progress import ProgressBar

    with ProgressBar(total, desc) as bar:
        yield bar.update
