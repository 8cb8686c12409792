"""The GPU check's torch sections: the CUDA tests, CUDA vs CPU parity and precision, the eager vs CUDA-graph
throughput sweep, and what a step's host copy costs (``tools.gpu_check`` runs each in its own process)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tools.gpu_setup import (
    BEAM,
    PARITY_IMAGES,
    Recorder,
    decode_all,
    first_tokens,
    load_model,
    rows_of,
    step_model,
    synthetic_inputs,
    test_features,
    time_decode,
    torch_and_cuda,
)

#: The checkout the CUDA tests are run from (the folder above ``tools/``).
ROOT = Path(__file__).resolve().parents[1]


def section_tests(args: SimpleNamespace, rec: Recorder) -> None:
    """(a) The CUDA-marked tests."""
    # The CUDA-marked tests, plus the CPU tests of the static step and the torch runtime on this machine's torch; the
    # compiled-step test is left to the compile section (its first compile alone can take tens of seconds).
    if not (ROOT / "tests" / "gpu").is_dir():
        rec.set(skipped=f"no tests/gpu under {ROOT}: the CUDA tests run from a checkout")
        return
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-k", "not compiled", "tests/gpu"]
    cmd += ["--ignore=tests/gpu/test_gpu_check.py"]  # this check itself
    cmd += ["tests/runtime/backends/test_static_cache.py", "tests/runtime/backends/test_torch_runtime.py"]
    start = time.perf_counter()
    returncode: int | str  # the process's, or "timeout"
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


def section_parity(args: SimpleNamespace, rec: Recorder) -> None:
    """(b) CUDA FP32 == CPU on 30 images; FP16/BF16 agreement and CIDEr-D against FP32 on the test split."""
    torch_and_cuda(args)
    from edgecap.runtime.decoding import decode

    model, vocab, cfg, note = load_model(args.run)
    feats, records, where = test_features(args, vocab is not None)
    real = feats is not None
    if feats is None:
        feats = synthetic_inputs(args.images, model.feature_dim)
    n = int(feats["features"].shape[0])
    rec.set(model=note, data=where, images=n, beam=BEAM, tf32=False)
    first = {k: v[:PARITY_IMAGES] for k, v in feats.items()}
    cpu = first_tokens(decode(step_model(model, "fp32", "eager", "cpu"), first, cfg))
    precisions = ("fp32", "fp16", "bf16", "fp16-autocast") if args.device != "cpu" else ("fp32", "bf16")
    refs = None
    if real and vocab is not None and records and len(records) >= n:  # CIDEr-D of captions of synthetic features: none
        refs = {r.image_id: [" ".join(c) for c in r.captions] for r in records[:n]}
    baseline: list[list[int]] | None = None
    for precision in precisions:
        for mode in ("eager", "cuda-graph"):
            start = time.perf_counter()
            try:
                got = decode_all(step_model(model, precision, mode, args.device), feats, cfg, 50)
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
                from edgecap.workshop.evaluation.cider import cider_d

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


def section_sweep(args: SimpleNamespace, rec: Recorder) -> None:
    """(c) torch CUDA eager vs CUDA graph, batch 1..256, beam 3, FP32/FP16: captions/s and per-step ms."""
    torch = torch_and_cuda(args)
    model, vocab, cfg, note = load_model(args.run)
    feats, _, where = test_features(args, vocab is not None)
    if feats is None:
        feats = synthetic_inputs(max(args.batches), model.feature_dim)
    rec.set(model=note, data=where, beam=BEAM, repeats_wanted=args.repeats)
    # The targets first (batch 1 eager vs graph; the largest batch in FP16), then the rest of the grid.
    precisions = ("fp32", "fp16-autocast", "fp16") if args.device != "cpu" else ("fp32",)
    big = max(args.batches)
    target = 256 if 256 in args.batches else big
    grid = [(1, "fp32"), *((target, p) for p in precisions[1:]), *((1, p) for p in precisions[1:]), (target, "fp32")]
    grid = list(dict.fromkeys(grid + [(b, p) for b in sorted(args.batches) for p in precisions]))
    models = {(p, m): step_model(model, p, m, args.device) for p in precisions for m in ("eager", "cuda-graph")}
    end = time.perf_counter() + args.section_budget - 10
    for i, (batch, precision) in enumerate(grid):
        left = end - time.perf_counter()
        if left < 2:
            rec.add({"batch": batch, "precision": precision, "skipped": "section budget spent"})
            continue
        inputs = {k: v.to(args.device) for k, v in rows_of(feats, 0, batch).items()}  # as a GPU backbone leaves them
        per_config = left / max(1, 2 * (len(grid) - i))
        for mode in ("eager", "cuda-graph"):
            row = {"batch": batch, "precision": precision, "step_mode": mode}
            try:
                row |= time_decode(
                    models[(precision, mode)], inputs, cfg, args.repeats, 2, time.perf_counter() + per_config
                )
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"
            rec.add(row)
        if args.device != "cpu":
            torch.cuda.empty_cache()


def section_transfer(args: SimpleNamespace, rec: Recorder) -> None:
    """(c2) What a step's host copy costs: the full (R, V) float32 log-probs vs a device top-2K pre-selection."""
    torch = torch_and_cuda(args)
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
