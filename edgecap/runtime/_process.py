"""Stopping a child process politely, then firmly (benchmark workers, the tegrastats sampler)."""

from __future__ import annotations

import subprocess


def terminate(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM ``process``, wait up to ``timeout`` seconds, then SIGKILL it; always reaped on return."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
