"""Run files get the permissions a plain ``open`` gives (0666 less the umask), whichever writer made them."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from edgecap.workshop.training import checkpoint as ckpt


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_checkpoint_and_run_files_have_the_umask_default_mode(tmp_path, umask):
    old = os.umask(umask)
    try:
        run = tmp_path / "run"
        run.mkdir()
        model = torch.nn.Linear(3, 2)
        ckpt.save_training_state(run, model, {"progress": {"step": 1}})
        ckpt.save_weights(model, run / ckpt.WEIGHTS)
        ckpt.write_config(run, {"model": {"name": "x"}})
        with open(run / "plain.txt", "w") as f:  # what a normal open gives
            f.write("x")
    finally:
        os.umask(old)
    expected = 0o666 & ~umask
    assert stat.S_IMODE((run / "plain.txt").stat().st_mode) == expected
    for path in (run / ckpt.LAST / ckpt.WEIGHTS, run / ckpt.LAST / ckpt.STATE, run / ckpt.WEIGHTS, run / ckpt.CONFIG):
        assert stat.S_IMODE(path.stat().st_mode) == expected, path
    assert stat.S_IMODE((run / ckpt.LAST).stat().st_mode) == 0o777 & ~umask
