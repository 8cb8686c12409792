"""Worker processes: a shared thread budget, and a worker that fails or dies is an error, never a hang."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from edgecap.runtime.collections.pool import WorkerError, WorkerPool, split_threads
from edgecap.runtime.collections.worker import WorkerSpec
from tests.runtime.bundle.helpers import pixel_bundle
from tests.runtime.collections.helpers import make_collection


def test_the_thread_budget_is_split_and_each_worker_pinned_to_its_share() -> None:
    assert split_threads(5, 1, cpus=[0, 1]) == [(5, None)]
    assert split_threads(5, 2, cpus=[0, 1, 2, 3]) == [(3, (0, 2)), (2, (1, 3))]
    assert split_threads(1, 2, cpus=[0, 1]) == [(1, (0,)), (1, (1,))]  # at least one thread each
    assert split_threads("auto", 3, cpus=[4, 5]) == [("auto", (4,)), ("auto", (5,)), ("auto", (4,))]
    assert split_threads(0, 2, cpus=[]) == [(0, None), (0, None)]
    with pytest.raises(ValueError, match="workers"):
        split_threads(1, 0)


def test_a_bundle_that_cannot_load_is_the_workers_message(tmp_path: Path) -> None:
    with WorkerPool(WorkerSpec(bundle=str(tmp_path / "missing")), 2) as pool, pytest.raises(WorkerError) as caught:
        pool.wait_ready()
    assert "could not load" in str(caught.value) and "missing" in str(caught.value)


def test_a_worker_killed_mid_run_is_a_clear_error(
    tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    bundle = pixel_bundle(tiny_data, tmp_path_factory)[0]
    paths = [str(p) for p in make_collection(tmp_path, 4, folders=1)]
    with WorkerPool(WorkerSpec(bundle=str(bundle), load={"threads": 1}), 2) as pool:
        pool.wait_ready()
        pool.submit(0, paths)
        assert pool.result()[0] == 0
        victim = pool._workers[1].process.pid
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(WorkerError, match=f"pid {victim}\\) was killed by signal 9.*--resume"):
            for chunk in range(1, 4):
                pool.submit(chunk, paths)
            for _ in range(3):
                pool.result()
