"""A tiny trained ``acort-test`` run (4 heads, radix base 64) that the pruning and sparsity tests derive runs from,
trained once per test process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workshop.training.helpers import tiny_train_cfg

_RUNS: dict[str, Path] = {}


def tiny_run_dir(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Train it on first use; later calls (any test module) get the same directory."""
    from edgecap.workshop.training.loop import train

    if "run" not in _RUNS:
        out = tmp_path_factory.mktemp("compression") / "run"
        cfg = tiny_train_cfg(tiny_data, out, max_steps=6, model_overrides={"radix_base": 64, "heads": 4})
        _RUNS["run"] = train(cfg, progress=False)
    return _RUNS["run"]
