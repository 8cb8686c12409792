"""Stopping a child process politely, then firmly (benchmark workers, the tegrastats sampler)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable


def terminate(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM ``process``, wait up to ``timeout`` seconds, then SIGKILL it; always reaped on return."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when its parent dies (Linux
    ``PR_SET_PDEATHSIG``), so a server started by a process that is killed outright (SIGKILL, a crashed test run)
    stops by itself instead of lingering on its ports; None elsewhere. libc is loaded here, in the parent: the
    child, forked from a process that may run threads, only makes the call."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)

    def set_parent_death_signal() -> None:
        prctl(pr_set_pdeathsig, sigterm, 0, 0, 0)

    return set_parent_death_signal
