"""What the GPU check's sections share: the per-section JSON record, the model and test features they decode, and
the timed decode (``tools.gpu_check`` runs the sections; ``gpu_sections`` and ``gpu_runtimes`` hold them)."""

from __future__ import annotations

import copy
import json
import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tools.files import write_json

FEATURE_CACHE = Path(tempfile.gettempdir()) / "edgecap-gpu-check" / "features.pt"
BEAM = 3
PARITY_IMAGES = 30


# -- recording ---------------------------------------------------------------------------------------------------------
class Recorder:
    """``OUT/<section>.json``, rewritten atomically after every :meth:`add`/:meth:`set`."""

    def __init__(self, out: Path, section: str) -> None:
        self.path = out / f"{section}.json"
        self.data: dict[str, Any] = {"section": section, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.data["rows"] = []
        self._flush()

    def set(self, **values: Any) -> None:
        """Update the section's fields and rewrite the file."""
        self.data.update(values)
        self._flush()

    def add(self, row: Mapping[str, Any]) -> None:
        """Append a row (also printed) and rewrite the file."""
        self.data["rows"].append(dict(row))
        print(json.dumps(row), flush=True)
        self._flush()

    def _flush(self) -> None:
        write_json(self.path, self.data)


def median_spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and count of ``values``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


# -- shared setup -----------------------------------------------------------------------------------------------------
def torch_and_cuda(args: SimpleNamespace) -> Any:
    """torch, with TF32 off; exits when ``--device cuda`` has no CUDA (``--device cpu`` is the CI smoke test)."""
    import torch

    if args.device == "cpu":
        return torch
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: torch.cuda.is_available() is False")
    torch.backends.cuda.matmul.allow_tf32 = False  # FP32 means FP32 (conv TF32 is switched off too)
    torch.backends.cudnn.allow_tf32 = False
    return torch


def load_model(run: str | None) -> tuple[Any, Any, Any, str]:
    """(model on CPU, vocab or None, DecodeCfg at beam 3, note)."""
    import torch

    from edgecap.runtime.captioning import decode_cfg_for

    if run:
        from edgecap.workshop.runs import load_run

        trained = load_run(run, device="cpu")
        cfg = decode_cfg_for(trained.vocab, beam_size=BEAM, max_words=trained.max_words)
        return trained.model.eval(), trained.vocab, cfg, f"trained run {run}"
    import dataclasses

    from tools.random_models import random_setup

    setup = random_setup("acort-xsmall", 1, 0)
    torch.manual_seed(0)
    model, cfg = setup.model, dataclasses.replace(setup.decode_cfg, beam_size=BEAM, max_len=51)
    return model, None, cfg, "random-weights acort-xsmall: agreement and CIDEr-D are NOT meaningful"


def test_dataset(args: SimpleNamespace) -> tuple[list[Any], str]:
    """The test records (with references) and where they came from."""
    from edgecap.workshop.data.datasets import load_dataset

    candidates = [Path(args.data)] if args.data else []
    if args.run:
        candidates += [Path(args.run).parent / "synthetic", Path(args.run) / "synthetic"]
    for path in candidates:
        if (path / "dataset.json").is_file():
            records = [r for r in load_dataset(path).split("test") if r.path is not None]
            return records[: args.images], f"{path} (test split)"
    from edgecap.workshop.data.synthetic import generate_dataset

    target = Path(tempfile.gettempdir()) / "edgecap-gpu-check" / "synthetic"
    if not (target / "dataset.json").is_file():
        generate_dataset(target, 200, seed=0, overwrite=True, progress=False)
    records = [r for r in load_dataset(target) if r.path is not None]
    note = f"{target}: regenerated 200 scenes at seed 0 (all splits: some are the quickstart's training scenes)"
    return records[: args.images], note


def test_features(args: SimpleNamespace, trained_run: bool) -> tuple[dict[str, Any] | None, list[Any], str]:
    """Backbone features of the test images, computed once on the CPU (so CPU and CUDA decoders see the same
    inputs) and cached in a temp file for later sections; None with the reason when the backbone is unavailable."""
    import torch

    if not trained_run:
        return None, [], "random weights: synthetic features"
    records, where = test_dataset(args)
    if FEATURE_CACHE.is_file():
        cached = torch.load(FEATURE_CACHE, weights_only=True)
        return dict(cached), records, where + " [cached features]"
    try:
        from edgecap.workshop.runs import load_run
        from edgecap.workshop.torch_runtime.images import BackboneInputs, backbone_from_spec

        spec = load_run(args.run, device="cpu").backbone_spec
        inputs = BackboneInputs(backbone_from_spec(spec), "cpu")
        parts = [inputs([r.path for r in records[i : i + 25]]) for i in range(0, len(records), 25)]
    except Exception as exc:  # noqa: BLE001 - the reason is recorded and the check goes on with synthetic features
        return None, records, f"backbone unavailable ({type(exc).__name__}: {exc}); synthetic features"
    feats = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    FEATURE_CACHE.parent.mkdir(parents=True, exist_ok=True)
    tmp = FEATURE_CACHE.with_suffix(".tmp")
    torch.save(feats, tmp)
    os.replace(tmp, FEATURE_CACHE)
    return feats, records, where


def synthetic_inputs(batch: int, feature_dim: int, seed: int = 0) -> dict[str, Any]:
    """Random ReLU6-like features on a 7 x 7 grid (``tools.random_models.grid_inputs``)."""
    from tools.random_models import grid_inputs

    return grid_inputs(batch, feature_dim, seed)


def rows_of(feats: Mapping[str, Any], start: int, count: int) -> dict[str, Any]:
    """``count`` images from ``start``, wrapping around (tiles the test set to any batch)."""
    import torch

    n = int(next(iter(feats.values())).shape[0])
    index = torch.arange(start, start + count) % n
    return {k: v.index_select(0, index) for k, v in feats.items()}


PRECISIONS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "fp16": {"dtype": "float16"},  # the weights cast to half (the runtime's precision="fp16" is "fp16-autocast")
    "bf16": {"dtype": "bfloat16"},
    "fp16-autocast": {"autocast": "float16"},
}


def step_model(model: Any, precision: str, mode: str, device: str) -> Any:
    """A fresh adapter on a copy of ``model`` (casting is in place); on CPU ``cuda-graph`` runs as ``static``."""
    import torch

    from edgecap.workshop.torch_runtime.runtime import TorchStepModel

    if device == "cpu" and mode == "cuda-graph":
        mode = "static"

    kw = {k: getattr(torch, v) for k, v in PRECISIONS[precision].items()}
    return TorchStepModel(copy.deepcopy(model), device, step_mode=mode, **kw)


def first_tokens(hyps: Sequence[Sequence[Any]]) -> list[list[int]]:
    """Each image's best hypothesis as token ids."""
    return [list(h[0].tokens) for h in hyps]


def decode_all(step_model: Any, feats: Mapping[str, Any], cfg: Any, batch: int) -> list[list[int]]:
    """Token ids of every image of ``feats``, decoded ``batch`` images at a time."""
    from edgecap.runtime.decoding import decode

    n = int(next(iter(feats.values())).shape[0])
    out: list[list[int]] = []
    for start in range(0, n, batch):
        part = {k: v[start : start + batch] for k, v in feats.items()}
        out += first_tokens(decode(step_model, part, cfg))
    return out


def time_decode(
    step_model: Any, inputs: Mapping[str, Any], cfg: Any, repeats: int, warmup: int, deadline: float
) -> dict[str, Any]:
    """Timed decodes of ``inputs`` (``warmup`` untimed first; stops at ``deadline`` after 2): captions/s and the
    per-step split of the loop into the step call, ``select`` and the host search."""
    from edgecap.bench.harness import TimedStepModel
    from edgecap.runtime.decoding import decode

    timed = TimedStepModel(step_model)
    walls, step_ms, steps, search_ms, select_ms = [], [], [], [], []
    for r in range(warmup + repeats):
        if r >= warmup + 2 and time.perf_counter() > deadline:
            break
        timed.reset()
        start = time.perf_counter()
        decode(timed, inputs, cfg)
        wall = time.perf_counter() - start
        t = timed.times()
        if r >= warmup:
            walls.append(wall)
            steps.append(t.steps)
            step_ms.append(1e3 * t.step_s / max(t.steps, 1))
            select_ms.append(1e3 * t.select_s / max(t.steps, 1))
            search_ms.append(1e3 * (wall - t.encode_s - t.step_s - t.select_s) / max(t.steps, 1))
    batch = int(inputs["features"].shape[0])
    spread = median_spread(walls)
    return {
        "captions_per_s": round(batch / spread["median"], 1),
        "captions_per_s_range": [round(batch / spread["max"], 1), round(batch / spread["min"], 1)],
        "wall_ms": round(1e3 * spread["median"], 3),
        "loop_ms_per_step": round(1e3 * spread["median"] / statistics.median(steps), 4),
        "step_call_ms": round(statistics.median(step_ms), 4),
        "select_call_ms": round(statistics.median(select_ms), 4),
        "host_search_ms_per_step": round(statistics.median(search_ms), 4),
        "steps": statistics.median(steps),
        "repeats": len(walls),
    }
