"""Child processes that stop with their parent (servers started by ``edgecap serve`` and the tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

PARENT = """
import subprocess, sys, time
from edgecap.runtime._process import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=die_with_parent())
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_stops_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())  # type: ignore[union-attr]
        assert psutil.pid_exists(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and psutil.pid_exists(child):
            try:
                if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the child outlived its killed parent by 10 s")
    finally:
        parent.kill()
        parent.wait()
