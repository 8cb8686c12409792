"""The served side of the serving benchmark: an ``edgecap serve`` subprocess on loopback, its Triton metrics and
CPU time, the wait for a quiet machine before each measurement, the machine's description and the report file.

The benchmark starts the server itself, as a user would (``python -m edgecap serve BUNDLE ...`` of the running
environment, the ``[cpu,serve]`` one), on free loopback ports, so its numbers include everything a user's server
does.
"""

from __future__ import annotations

import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

#: Processes of other benchmarks that share this machine (the pattern of ``pgrep -fa``).
OTHERS = re.compile(r"edgecap|tritonserver|triton_python_backend_stub|\braylet\b|\bray\b")


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on loopback (bound, read, released)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class ServeProcess:
    """``edgecap serve BUNDLE`` with the given flags, on loopback; ready when started; SIGTERM drains."""

    def __init__(self, bundle: Path, flags: list[str], log: Path, ready_timeout_s: float = 300.0) -> None:
        self.http, self.grpc, self.metrics = free_ports(3)
        ports = ["--http-port", str(self.http), "--grpc-port", str(self.grpc), "--metrics-port", str(self.metrics)]
        self.command = [sys.executable, "-m", "edgecap", "serve", str(bundle), "--host", "127.0.0.1", *flags, *ports]
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"edgecap serve exited with {self.process.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"edgecap serve was not ready in {ready_timeout_s:.0f} s: {self.log_tail()}")

    def url(self, protocol: str) -> str:
        return f"{protocol}://127.0.0.1:{self.http if protocol == 'http' else self.grpc}"

    def counters(self) -> dict[str, float]:
        """Triton's counters (summed over models and GPUs), e.g. ``nv_inference_count``, ``nv_inference_exec_count``."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        found: dict[str, float] = {}
        for name, value in re.findall(r"^(nv_inference_\w+)\{[^}]*\} (\S+)$", text, re.M):
            found[name] = found.get(name, 0.0) + float(value)
        return found

    def cpu_s(self) -> float:
        """CPU seconds used so far by the server: ``edgecap serve``, ``tritonserver`` and the backend stubs."""
        total = 0.0
        try:
            root = psutil.Process(self.process.pid)
            for proc in [root, *root.children(recursive=True)]:
                try:
                    times = proc.cpu_times()
                    total += times.user + times.system
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        return total

    def pids(self) -> set[int]:
        try:
            root = psutil.Process(self.process.pid)
            return {root.pid, *(p.pid for p in root.children(recursive=True))}
        except psutil.Error:
            return set()

    def sigterm(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 90.0) -> int:
        self.sigterm()
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def formed_batch(delta: dict[str, float]) -> float:
    """The mean batch Triton formed: images inferred / model executions (``nv_inference_count`` over
    ``nv_inference_exec_count``)."""
    executions = delta.get("nv_inference_exec_count", 0.0)
    return delta.get("nv_inference_count", 0.0) / executions if executions else 0.0


def own_pids() -> set[int]:
    """This process, its ancestors (the shell that started it) and its children (the server it started)."""
    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.parents()), *(p.pid for p in me.children(recursive=True))}


def busy_others(
    mine: set[int], sample_s: float = 1.0, min_cpu_pct: float = 5.0, max_total_pct: float = 25.0
) -> list[str]:
    """What else keeps the machine busy over ``sample_s``: other benchmarks (:data:`OTHERS`) using at least
    ``min_cpu_pct`` of a core, or any other processes when together they use more than ``max_total_pct`` (a test run
    whose command line names no benchmark is load all the same). Empty when the machine is quiet."""
    candidates = []
    for proc in psutil.process_iter(["pid", "cmdline", "name"]):
        if proc.info["pid"] in mine:
            continue
        try:
            proc.cpu_percent(None)
            candidates.append((proc, " ".join(proc.info.get("cmdline") or []) or str(proc.info.get("name"))))
        except psutil.Error:
            pass
    time.sleep(sample_s)
    used = []
    for proc, cmdline in candidates:
        try:
            pct = proc.cpu_percent(None)
        except psutil.Error:
            continue
        if pct > 0:
            used.append((pct, proc.pid, cmdline))
    used.sort(reverse=True)
    listed = [f"{pid} {pct:.0f}% {cmdline[:160]}" for pct, pid, cmdline in used]
    if sum(pct for pct, _, _ in used) > max_total_pct:
        return listed[:5]
    return [
        text
        for (pct, _, cmdline), text in zip(used, listed, strict=True)
        if pct >= min_cpu_pct and OTHERS.search(cmdline)
    ]


def wait_for_quiet(phase: str, mine: set[int], deadline: float, poll_s: float = 10.0) -> dict[str, Any]:
    """Wait (until ``deadline``, ``time.time()``) while other benchmarks run; quiet means three quiet one-second
    samples in a row (tests start and stop between samples). Records the load seen either way."""
    start = time.time()
    seen: list[str] = []

    def busy_now() -> list[str]:
        for _ in range(3):
            busy = busy_others(mine)
            if busy:
                return busy
        return []

    busy = busy_now()
    while busy and time.time() < deadline:
        seen.extend(b for b in busy if b not in seen)
        time.sleep(min(poll_s, max(0.0, deadline - time.time())))
        busy = busy_now()
    return {
        "phase": phase,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "waited_s": round(time.time() - start, 1),
        "others_busy_before": seen[:5],
        "others_busy_at_start": busy[:5],
    }


def machine() -> dict[str, Any]:
    from edgecap.runtime.backends.cpu import cpu_model

    model = cpu_model() or platform.processor()
    import onnxruntime

    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
