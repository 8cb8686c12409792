"""The search and the ONNX Runtime adapters import without torch: a deployment on ONNX Runtime never loads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# Refuses any import of torch (a meta-path finder placed first), imports the modules, then decodes with a numpy step
# model, so both import-time and run-time imports of torch fail loudly.
SCRIPT = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"blocked import of {name}")
        return None

sys.meta_path.insert(0, NoTorch())
import importlib
import numpy as np

for name in sys.argv[1:]:
    importlib.import_module(name)

from edgecap.runtime.decoding import DecodeCfg, decode

class Uniform:
    def encode(self, inputs):
        return {"h": np.zeros((inputs["x"].shape[0], 1), dtype=np.float32)}

    def step(self, tokens, state):
        lp = np.full((tokens.shape[0], 6), -np.log(6.0), dtype=np.float32)
        lp[:, 3] += 0.5
        return lp, state

    def select(self, state, index):
        return {k: v[index] for k, v in state.items()}

for strategy in ("beam", "greedy", "sample"):
    out = decode(Uniform(), {"x": np.zeros((2, 1))}, DecodeCfg(strategy=strategy, max_len=4, seed=0, min_len=1))
    assert len(out) == 2 and out[0][0].tokens, (strategy, out)
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch was imported"
print("ok")
"""

MODULES = [
    "edgecap.runtime.decoding",
    "edgecap.runtime.decoding.arrays",
    "edgecap.runtime.decoding.beam",
    "edgecap.runtime.decoding.config",
    "edgecap.runtime.decoding.dispatch",
    "edgecap.runtime.decoding.greedy",
    "edgecap.runtime.decoding.mask_predict",
    "edgecap.runtime.decoding.processors",
    "edgecap.runtime.decoding.protocol",
    "edgecap.runtime.decoding.radix",
    "edgecap.runtime.decoding.sampling",
    "edgecap.runtime.decoding.search",
    "edgecap.runtime.backends",
    "edgecap.runtime.backends.bridge",
    "edgecap.runtime.backends.onnxruntime.session",
    "edgecap.runtime.backends.refine",
    "edgecap.runtime.backends.onnxruntime.decoders",
]


@pytest.fixture(autouse=True, params=["numpy"])
def array_backend() -> str:
    """One run only (overrides the package's per-backend fixture: nothing here uses the fakes)."""
    return "numpy"


def test_search_and_onnxruntime_adapters_import_and_decode_without_torch() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *MODULES], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
