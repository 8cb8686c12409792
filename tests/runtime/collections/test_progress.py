"""The progress line: done/total, rate, ETA; redrawn on a terminal, a plain line in a log."""

from __future__ import annotations

import io

from edgecap.runtime.collections import progress
from edgecap.runtime.collections.progress import Progress, format_duration


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_line_says_count_rate_and_eta(monkeypatch) -> None:
    clock = iter([100.0, 100.0, 110.0, 110.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    bar = Progress(1000, stream=io.StringIO())
    bar.start()
    bar.update(100, errors=2)
    assert bar.line() == "captioned 100/1,000  10.0%, 2 bad · 10.0 images/s · ETA 0:01:30"
    assert format_duration(3725) == "1:02:05"


def test_a_terminal_is_redrawn_in_place_and_a_log_gets_lines(monkeypatch) -> None:
    terminal, log = _Terminal(), io.StringIO()
    for stream in (terminal, log):
        bar = Progress(10, stream=stream)
        monkeypatch.setattr(progress, "LOG_SECONDS", 0.0)
        monkeypatch.setattr(progress, "_TTY_SECONDS", 0.0)
        bar.update(5)
        bar.close()
    assert terminal.getvalue().startswith("\rcaptioned 5/10") and terminal.getvalue().endswith("\n")
    assert log.getvalue().count("\n") == 2 and "\r" not in log.getvalue()
    quiet = io.StringIO()
    Progress(10, stream=quiet, enabled=False).close()
    assert quiet.getvalue() == ""
