"""``benchmarks/ort_threads.py``: its settings grid, decoding settings, and the worker protocol on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from edgecap.export.spec import get_export_spec
from edgecap.models import get_model_cfg
from edgecap.runtimes.threads import LARGE_STEP_BYTES, plan_threads
from tests.export.helpers import AR_TEST_CONFIGS, exported, tiny_model
from tests.scripts import load_script

script = load_script("ort_threads")


def test_the_grid_measures_each_distinct_session_once() -> None:
    chosen = script.settings([1, 2], LARGE_STEP_BYTES // 4, cores=2)
    labels = [s.label for s in chosen]
    assert labels == ["auto", "dedicated", "ort-default", "1", "1 spin", "2", "2 spin"]
    keys = {s.label: s.key for s in chosen}
    assert keys["1"] == keys["1 spin"] == keys["dedicated"]  # one thread has no pool: nothing spins
    assert keys["auto"] != keys["1"]  # two cores: auto runs large calls on a wide session (the per-call default)
    assert len({keys["ort-default"], keys["2 spin"], keys["2"], keys["1"], keys["auto"]}) == 5
    single = {s.label: s.key for s in script.settings([1], LARGE_STEP_BYTES // 4, cores=1)}
    assert single["auto"] == single["1"]  # one core: auto has no wide session


def test_forced_decoding_settings() -> None:
    acort = script.decode_cfg("acort-xsmall", 3, 26)
    assert (acort["max_len"], acort["min_len"], acort["beam_size"], acort["strategy"]) == (26, 25, 3, "beam")
    base = get_model_cfg("acort-xsmall").radix_base
    assert acort["radix"] == [base, 2, script.PAPER_WORDS] and acort["bos_id"] == base + 1
    words = script.decode_cfg("expansionnet-v2", 1, 19)
    assert words["radix"] is None and words["strategy"] == "greedy" and words["max_len"] == 19


def test_workers_decode_on_request_and_report_wall_and_cpu_time(tmp_path: Path) -> None:
    name = next(n for n in AR_TEST_CONFIGS if get_model_cfg(n).vocab_kind == "word")
    for role, graph in exported(name).runtime_models("fp32").items():
        (tmp_path / f"{role}.onnx").write_bytes(graph.SerializeToString())
    spec = get_export_spec(tiny_model(name), name=name)
    encoder = spec.graph(spec.runtime_graphs["encoder"])
    made = encoder.make_inputs(spec.sizes_for(encoder, {"batch": 2}), torch.Generator().manual_seed(0))
    np.savez(tmp_path / "inputs_2.npz", **{n: made[n].numpy() for n in spec.decode_inputs})
    fields = {"strategy": "beam", "beam_size": 2, "max_len": 4, "min_len": 3, "pad_id": 0, "bos_id": 1, "eos_id": 2}
    (tmp_path / "decode.json").write_text(json.dumps({**fields, "radix": None}))
    workers = {
        "auto": script.Worker(tmp_path, plan_threads("auto")),
        "spin": script.Worker(tmp_path, plan_threads(2, True)),
    }
    try:
        wall, cpu = script.measure(workers, 2, repeats=2, settle=0.0)
    finally:
        for worker in workers.values():
            worker.close()
    for label in workers:
        assert len(wall[label]) == len(cpu[label]) == 2
        assert all(t > 0 for t in wall[label]) and all(c >= 0 for c in cpu[label])
    assert all(w.process.returncode == 0 for w in workers.values())
