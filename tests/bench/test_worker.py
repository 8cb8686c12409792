"""The worker protocol (``edgecap.bench.worker``): a group in a fresh process, its progress and outcome as typed
messages, and a worker that fails or dies becoming an error entry instead of stopping the run."""

from __future__ import annotations

import ast
import multiprocessing
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgecap.bench.config import BenchCfg
from edgecap.bench.measure import GroupOutcome, GroupTask
from edgecap.bench.worker import Failed, Finished, Progress, _receive, run_isolated

ROOT = Path(__file__).resolve().parents[2]


def _task(bundle: Path) -> GroupTask:
    cfg = BenchCfg(bundles=(str(bundle),), runtimes=("torch",))
    return GroupTask(str(bundle), "m", "torch", "fp32", (1,), cfg, None, None)


@pytest.mark.parametrize("spawn", [False, True], ids=["subprocess", "spawn"])
def test_a_group_that_cannot_load_comes_back_as_an_error_from_its_worker(tmp_path: Path, spawn: bool) -> None:
    events: list[tuple[str, str]] = []
    outcome = run_isolated(_task(tmp_path / "missing"), lambda e, label: events.append((e, label)), spawn=spawn)
    assert outcome.results == [] and len(outcome.errors) == 1
    error = outcome.errors[0]
    assert (error.runtime, error.precision, error.bundle) == ("torch", "fp32", str(tmp_path / "missing"))
    assert "missing" in error.reason and "Traceback" in error.reason  # the worker's exception, with where it rose
    assert events == []  # nothing started


def test_a_worker_measures_its_group_and_reports_progress_around_each_unit(tiny_bundle: Path) -> None:
    cfg = BenchCfg(
        bundles=(str(tiny_bundle),),
        runtimes=("torch",),
        batches=(2,),
        warmup=1,
        min_repeats=2,
        min_seconds=0.0,
        quality=False,
        threads=1,
    )
    task = GroupTask(str(tiny_bundle), "tiny", "torch", "fp32", (1,), cfg, None, None)
    events: list[tuple[str, str]] = []
    outcome = run_isolated(task, lambda e, label: events.append((e, label)))
    assert not outcome.errors and [(r.runtime, r.batch) for r in outcome.results] == [("torch", 2)]
    assert events == [("start", "tiny torch fp32 beam 1 batch 2"), ("done", "tiny torch fp32 beam 1 batch 2")]


def test_a_script_without_a_main_guard_can_run_isolated_groups(tmp_path: Path) -> None:
    """The worker is a subprocess, not a multiprocessing spawn: the caller's script is not re-imported in it."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from edgecap.bench.config import BenchCfg
            from edgecap.bench.measure import GroupTask
            from edgecap.bench.worker import run_isolated

            print("script body ran")
            cfg = BenchCfg(bundles=("b",), runtimes=("torch",))
            task = GroupTask({str(tmp_path / "missing")!r}, "m", "torch", "fp32", (1,), cfg, None, None)
            print(len(run_isolated(task, lambda e, label: None, spawn=False).errors), "error")
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["script body ran", "1 error"]


def test_progress_is_passed_on_until_the_outcome() -> None:
    parent, child = multiprocessing.Pipe()
    child.send(Progress("start", "a"))
    child.send(Progress("done", "a"))
    child.send(Finished(GroupOutcome()))
    events: list[tuple[str, str]] = []
    assert _receive(parent, lambda e, label: events.append((e, label))) == Finished(GroupOutcome())
    assert events == [("start", "a"), ("done", "a")]


def test_a_worker_that_dies_or_breaks_the_protocol_is_told_apart() -> None:
    parent, child = multiprocessing.Pipe()
    child.send(Progress("start", "a"))
    child.close()  # died before its outcome: the caller reports the exit code
    assert _receive(parent, lambda e, label: None) is None
    parent, child = multiprocessing.Pipe()
    child.send("@@edgecap-bench@@ done a")
    reply = _receive(parent, lambda e, label: None)
    assert isinstance(reply, Failed) and "not a protocol message" in reply.error


def _bench_imports(path: Path) -> set[str]:
    """Every ``edgecap.bench.*`` module ``path`` imports, at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "edgecap.bench":
                found.update(f"edgecap.bench.{a.name}" for a in node.names)
            elif node.module.startswith("edgecap.bench."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("edgecap.bench."))
    return found


def test_bench_modules_import_each_other_without_a_cycle() -> None:
    """Function-level imports count: a cycle through one is still one module needing the other to be complete."""
    modules = {f"edgecap.bench.{p.stem}": p for p in (ROOT / "edgecap" / "bench").glob("*.py") if p.stem != "__init__"}
    graph = {name: _bench_imports(path) & set(modules) - {name} for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        assert name not in stack, f"import cycle: {' -> '.join((*stack[stack.index(name) :], name))}"
        if name in done:
            return
        for other in sorted(graph[name]):
            visit(other, (*stack, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())
    assert "edgecap.bench.results" in graph["edgecap.bench.markdown"]  # the report types' one home
