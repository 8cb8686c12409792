"""How many ONNX Runtime threads a session gets, and whether they spin (torch-free; see ``docs/cpu.md``).

ONNX Runtime's own default is one intra-op thread per physical core, each spinning while it waits for work. A
captioner's decoder step is a chain of small matmuls with Python's search in between: spinning threads burn the
core between ops and between steps (up to 5x the CPU time per caption, measured), stealing it from the thread
doing the work as soon as the machine is busy or small. :func:`plan_threads` turns what is known (the concurrent
decoding streams, the cores this process may use, the size of the step graph, what the user asked for) into the
settings, and says why.

The policy (measured with ``research/onnxruntime_threads.py`` and ``research/thread_crossover.py``; numbers in
``docs/cpu.md``):

- ``threads="auto"`` (the default) chooses per call. Each session has one intra-op thread (per stream), no spinning,
  sequential execution, one inter-op thread: one thread has no pool to wake or spin, the cheapest setting in CPU time
  and the fastest for small calls (a decoder step on a few hypotheses: ~90 tiny kernels, where a second thread only
  adds a wake-up per op). When the process may use at least two cores per stream, each graph also gets a *wide*
  session (:class:`WidePlan`: the usable cores ÷ streams, no spinning), created on the first call whose rows (the
  feed's leading dimension: images for the encoder, hypotheses for the step) reach :data:`WIDE_FROM_ROWS`; those
  calls run on it, since their matmuls are large enough to split between threads. On those cores a batch of images
  also decodes as concurrent chunks, one per core (``decode_workers``; :mod:`edgecap.runtime.decoding.parallel`), each
  on
  the one-thread sessions: every image's search is independent, and a chunk wakes no other thread per kernel. The
  wide session then serves what cannot be split (one image with many beams).
- ``threads="dedicated"``: the cores are this process's alone (nothing to share them with). A step graph of at least
  :data:`LARGE_STEP_BYTES` gets the usable cores shared out among the streams, spinning on; a smaller one gets one
  thread (the cheapest in CPU time).
- an int ``N >= 1``: exactly ``N`` intra-op threads, at most :func:`max_threads` (:data:`MAX_THREADS_PER_CPU` per
  CPU: beyond that threads only queue for the cores, and a typo such as 3000 would start them all); ``0``: ONNX
  Runtime's own default (one per physical core).
- ``spin=True/False`` overrides the spinning choice of any of these (the wide session's too). An explicit value
  always wins, and only ``"auto"`` has a wide session.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edgecap.runtime.backends.cpu import physical_cores

__all__ = [
    "LARGE_STEP_BYTES",
    "MAX_THREADS_PER_CPU",
    "RENAMED_POLICIES",
    "THREAD_POLICIES",
    "WIDE_FROM_ROWS",
    "ThreadPlan",
    "ThreadSettingError",
    "WidePlan",
    "check_threads",
    "max_threads",
    "plan_threads",
    "usable_cores",
]

#: The named thread policies (besides an explicit count).
THREAD_POLICIES = ("auto", "dedicated")
#: Earlier spellings of a plan's recorded ``policy`` (reports written before "ort" came to name only a model family).
RENAMED_POLICIES = {"ort-default": "onnxruntime-default"}

#: Step graphs at least this large (bytes on disk: ≈ their weights) may use more than one intra-op thread under
#: ``threads="dedicated"``. ExpansionNet v2 at the paper settings (≈ 50 MB FP32 decoder) is above it, acort-xsmall
#: (≈ 8 MB) below: a step that reads its weights from the last-level cache has too little work to share out.
LARGE_STEP_BYTES = 32 * 2**20

#: Graph role -> the rows (the feed's leading dimension) from which a call of ``threads="auto"`` runs on the wide
#: session (acort-xsmall at the paper settings, 1 vs 2 threads without spinning; ``docs/cpu.md``). The encoder gained
#: from 2 images on in ``research/thread_crossover.py``, even next to a busy process (batch 1 stays narrow: its users
#: pay nothing for the wide session). A decoder step is ~90 small kernels, each paying the second thread's wake-up: it
#: lost at few hypotheses and gained ≈ 20 % per step at 48 (beam 3 × 16 images) on free cores
#: (``research/onnxruntime_threads.py``). A role without an entry (LaBERT's ``refine``, not measured) keeps one thread.
WIDE_FROM_ROWS: dict[str, int] = {"encoder": 2, "step": 48}

#: An explicit thread count may be at most this many times ``os.cpu_count()`` (:func:`max_threads`): oversubscribing
#: a little is a measurement someone may want (``research/thread_crossover.py``), thousands of threads never are.
MAX_THREADS_PER_CPU = 4

#: ``SessionOptions`` config keys that allow ONNX Runtime's pool threads to spin while waiting.
SPIN_KEYS = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")


def _spin_config(spin: bool | None) -> dict[str, str]:
    """The ``SPIN_KEYS`` session config entries of a spinning choice; None = none (ONNX Runtime's default)."""
    return {} if spin is None else dict.fromkeys(SPIN_KEYS, "1" if spin else "0")


class ThreadSettingError(ValueError):
    """A thread or spinning setting that is not one edgecap understands."""


@dataclass(frozen=True)
class WidePlan:
    """The second session ``threads="auto"`` gives each graph for large calls (created on the first one).

    Attributes:
        intra_op: its intra-op threads (the usable cores ÷ streams, >= 2).
        spin: whether its pool threads spin while waiting (off unless ``spin=True`` was asked for).
        from_rows: ``(graph role, rows)`` pairs: a call of that graph whose feed has at least that many rows runs here.
    """

    intra_op: int
    spin: bool
    from_rows: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if isinstance(self.intra_op, bool) or not isinstance(self.intra_op, int) or self.intra_op < 2:
            raise ThreadSettingError(f"a wide session needs at least 2 intra-op threads, got {self.intra_op!r}")
        rows = dict(self.from_rows)
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in rows.values()):
            raise ThreadSettingError(f"wide session thresholds must be integers >= 1, got {rows!r}")
        object.__setattr__(self, "from_rows", tuple(sorted(rows.items())))

    def threshold(self, role: str | None) -> int | None:
        """The rows from which a call of ``role`` runs on the wide session; None = never (a role not measured)."""
        return dict(self.from_rows).get(role) if role is not None else None

    def session_config(self) -> dict[str, str]:
        """The wide session's spinning entries (always explicit: ONNX Runtime's default would spin)."""
        return _spin_config(self.spin)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record (inside :meth:`ThreadPlan.as_dict`)."""
        return {"intra_op": self.intra_op, "spin": self.spin, "from_rows": dict(self.from_rows)}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> WidePlan:
        """The plan back from :meth:`as_dict` (benchmark workers, report summaries)."""
        return cls(int(record["intra_op"]), bool(record["spin"]), tuple(dict(record["from_rows"]).items()))

    def describe(self) -> str:
        """A few words: ``"2 threads, no spinning, from 2 rows (encoder) / 48 (step)"``."""
        spinning = "spinning" if self.spin else "no spinning"
        rows = " / ".join(f"{n} ({role})" for role, n in self.from_rows)
        return f"{self.intra_op} threads, {spinning}, from {rows} rows"


@dataclass(frozen=True)
class ThreadPlan:
    """The threading one ONNX Runtime session gets.

    Attributes:
        intra_op: intra-op threads (0 = ONNX Runtime's own default, one per physical core).
        inter_op: inter-op threads (0 = ONNX Runtime's default); matters only with parallel execution.
        spin: whether pool threads spin while waiting (None = ONNX Runtime's default, which spins).
        execution_mode: ``"sequential"`` (a decoder step is a chain of ops: nothing to run side by side).
        policy: what was asked: ``"auto"``, ``"dedicated"``, ``"explicit"`` or ``"onnxruntime-default"``.
        reason: why these values, for logs and benchmark reports.
        wide: the second session large calls run on (``"auto"`` with >= 2 cores per stream); None = none.
        decode_workers: concurrent chunks of images a greedy or beam batch decodes in (``"auto"``: the usable cores
            ÷ streams); 1 = one decode. Applied by the step model, not the sessions
            (``create_onnxruntime_step_model(decode_workers=...)``).
    """

    intra_op: int
    inter_op: int
    spin: bool | None
    execution_mode: str
    policy: str
    reason: str
    wide: WidePlan | None = None
    decode_workers: int = 1

    def session_config(self) -> dict[str, str]:
        """The ``SessionOptions.add_session_config_entry`` pairs of the spinning choice (none = ONNX Runtime's
        default)."""
        return _spin_config(self.spin)

    def runtime_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~edgecap.runtime.backends.onnxruntime.session.OnnxRuntimeSession` that apply
        this
        plan."""
        return {
            "intra_op_threads": self.intra_op,
            "inter_op_threads": self.inter_op,
            "execution_mode": self.execution_mode,
            "session_config": self.session_config(),
            "wide": self.wide,
        }

    def step_model_options(self) -> dict[str, Any]:
        """Keyword arguments of :func:`~edgecap.runtime.backends.onnxruntime.step.create_onnxruntime_step_model`
        that apply
        this plan: the sessions' (:meth:`runtime_options`) and the step model's ``decode_workers``."""
        return {**self.runtime_options(), "decode_workers": self.decode_workers}

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record (``Captioner.runtime_info["threads"]``, benchmark rows)."""
        return {
            "intra_op": self.intra_op,
            "inter_op": self.inter_op,
            "spin": self.spin,
            "execution_mode": self.execution_mode,
            "policy": self.policy,
            "reason": self.reason,
            "wide": None if self.wide is None else self.wide.as_dict(),
            "decode_workers": self.decode_workers,
        }

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> ThreadPlan:
        """The plan back from :meth:`as_dict` (``runtime_info["threads"]``, benchmark rows; records written before
        the wide session or split decodes existed have no ``wide`` or ``decode_workers``, and older ones may name a
        policy by its earlier spelling, read as today's)."""
        fields = dict(record)
        policy = fields.get("policy")
        fields["policy"] = RENAMED_POLICIES.get(policy, policy) if isinstance(policy, str) else policy
        wide = fields.pop("wide", None)
        return cls(**fields, wide=None if wide is None else WidePlan.from_dict(wide))

    def describe(self) -> str:
        """A few words for summaries: ``"1 thread, no spinning"`` (plus the wide session's, when there is one)."""
        count = (
            f"{self.intra_op} thread" + "s" * (self.intra_op > 1) if self.intra_op else "ONNX Runtime's default threads"
        )
        spinning = {None: "ONNX Runtime's spinning", True: "spinning", False: "no spinning"}[self.spin]
        wide = "" if self.wide is None else f"; {self.wide.describe()}"
        split = "" if self.decode_workers < 2 else f"; batches in {self.decode_workers} concurrent chunks"
        return f"{count}, {spinning}{wide}{split}"


def usable_cores(
    affinity: Callable[[int], Any] | None = None,
    physical: Callable[[], int | None] | None = None,
    logical: Callable[[], int | None] | None = None,
) -> int:
    """The cores this process may run on: its CPU affinity (``os.sched_getaffinity``, Linux), capped at the
    physical cores (:mod:`edgecap.runtime.backends.cpu`; hyper-threads add little to matmuls), else
    ``os.cpu_count()``; at least 1.

    The arguments replace the three sources (for tests); None = this machine's.
    """
    affinity = affinity if affinity is not None else getattr(os, "sched_getaffinity", None)
    physical = physical if physical is not None else physical_cores
    logical = logical if logical is not None else os.cpu_count
    count = None
    if affinity is not None:
        try:
            count = len(affinity(0))
        except OSError:
            count = None
    cores = physical()
    if cores and (count is None or cores < count):
        count = cores
    return max(1, count or logical() or 1)


def max_threads(cpus: int | None = None) -> int:
    """The largest explicit thread count edgecap accepts: :data:`MAX_THREADS_PER_CPU` × the CPUs (``cpus``, default
    ``os.cpu_count()``)."""
    return MAX_THREADS_PER_CPU * max(1, cpus if cpus is not None else os.cpu_count() or 1)


def check_threads(threads: Any, spin: Any = None, streams: Any = 1) -> None:
    """Refuse what :func:`plan_threads` cannot take, with a message that says what it can.

    Raises:
        ThreadSettingError: ``threads`` is not ``"auto"``, ``"dedicated"``, None or an int in 0..:func:`max_threads`,
            ``spin`` is not None or a bool, or ``streams`` is not an int >= 1.
    """
    count = isinstance(threads, int) and not isinstance(threads, bool) and threads >= 0
    if not (threads is None or count or threads in THREAD_POLICIES):
        raise ThreadSettingError(
            f"threads must be {' or '.join(repr(p) for p in THREAD_POLICIES)} or an integer >= 0 "
            f"(0 = ONNX Runtime's own default), got {threads!r}"
        )
    if count and threads > max_threads():
        raise ThreadSettingError(
            f"threads={threads} is more than this machine can run: at most {max_threads()} "
            f"({MAX_THREADS_PER_CPU} per CPU, {os.cpu_count() or 1} CPUs); more only queue for the cores (docs/cpu.md)"
        )
    if spin is not None and not isinstance(spin, bool):
        raise ThreadSettingError(f"spin must be True, False or None (the policy's choice), got {spin!r}")
    if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
        raise ThreadSettingError(f"streams must be an integer >= 1, got {streams!r}")


def plan_threads(
    threads: int | str | None = "auto",
    spin: bool | None = None,
    *,
    streams: int = 1,
    cores: int | None = None,
    step_bytes: int | None = None,
) -> ThreadPlan:
    """The threading of each session of a captioner (see the module docstring for the policy).

    Args:
        threads: ``"auto"`` (None means the same), ``"dedicated"``, or an intra-op count (0 = ONNX Runtime's default).
        spin: force spinning on or off; None = the policy's choice.
        streams: decodes running at once in this process (e.g. captioners called from several threads).
        cores: usable cores; None = :func:`usable_cores`.
        step_bytes: size of the step (or refine) graph; None = unknown (treated as small).

    Raises:
        ThreadSettingError: a value outside those above, or ``streams < 1``.
    """
    check_threads(threads, spin, streams)
    threads = "auto" if threads is None else threads
    if isinstance(threads, int):
        if threads == 0:
            return ThreadPlan(0, 0, spin, "sequential", "onnxruntime-default", "requested: ONNX Runtime's own defaults")
        return ThreadPlan(
            threads, 1, False if spin is None else spin, "sequential", "explicit", f"requested {threads} thread(s)"
        )
    cores = usable_cores() if cores is None else max(1, int(cores))
    share = max(1, cores // streams)
    if threads == "auto":
        why = "one thread per stream for small calls: no pool to wake or spin, the cheapest in CPU time"
        if share < 2:
            return _plan(1, spin, False, "auto", why + f" ({cores} usable core(s) / {streams} stream(s))")
        wide = WidePlan(share, False if spin is None else spin, tuple(WIDE_FROM_ROWS.items()))
        rows = ", ".join(f"{role} from {n} rows" for role, n in wide.from_rows)
        why += (
            f"; a batch decodes as {share} concurrent chunks of images ({cores} usable cores / {streams} stream(s)); "
            f"other large calls ({rows}) on a second session of {share} threads, created on the first such call"
        )
        return _plan(1, spin, False, "auto", why, wide, share)
    if step_bytes is None or step_bytes < LARGE_STEP_BYTES:
        size = "unknown size" if step_bytes is None else f"{step_bytes / 2**20:.1f} MB"
        return _plan(1, spin, False, "dedicated", f"dedicated cores, but a small step graph ({size}): one thread")
    why = f"dedicated cores: {cores} usable / {streams} stream(s) for a {step_bytes / 2**20:.0f} MB step graph"
    return _plan(share, spin, share > 1, "dedicated", why)


def _plan(
    intra: int,
    spin: bool | None,
    spin_default: bool,
    policy: str,
    reason: str,
    wide: WidePlan | None = None,
    decode_workers: int = 1,
) -> ThreadPlan:
    if spin is not None:
        reason += f"; spinning {'on' if spin else 'off'} as requested"
    spinning = spin_default if spin is None else spin
    return ThreadPlan(intra, 1, spinning, "sequential", policy, reason, wide, decode_workers)
