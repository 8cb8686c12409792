"""The GPU check's runtime sections: ONNX Runtime's GPU execution providers and the TensorRT runtime where installed,
LaBERT mask-predict against length-aware autoregressive decoding per length level, and ``step_mode="compile"``."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from edgecap.runtime.precisions import FLOAT_PRECISIONS
from tools.gpu_setup import (
    BEAM,
    Recorder,
    load_model,
    rows_of,
    step_model,
    synthetic_inputs,
    test_features,
    time_decode,
    torch_and_cuda,
)


def section_onnxruntime(args: SimpleNamespace, rec: Recorder) -> None:
    """(d) ONNX Runtime CUDA/TensorRT execution providers and the ``tensorrt`` runtime, where installed."""
    torch_and_cuda(args)
    from edgecap.runtime.backends.registry import get_runtime, list_runtimes

    try:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
        rec.set(onnxruntime=onnxruntime.__version__, providers=providers)
    except ImportError as exc:
        providers = []
        rec.set(onnxruntime=None, providers=[], reason=str(exc))
    wanted = [("onnxruntime", p) for p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")]
    runnable: list[tuple[str, str | None]] = [(r, p) for r, p in wanted if p in providers]
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

    feats, records, _ = test_features(args, args.run is not None)
    paths = [r.path for r in records[:64]]
    for runtime, provider in runnable:
        short = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "tensorrt", None: None}[provider]
        for precision in FLOAT_PRECISIONS:
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


def _bundle(args: SimpleNamespace, rec: Recorder) -> Path | None:
    """A bundle of the run (FP32 + FP16 graphs) in a temp dir, for the ONNX Runtime and TensorRT rows."""
    target = Path(tempfile.gettempdir()) / "edgecap-gpu-check" / "bundle"
    if (target / "manifest.json").is_file():
        return target
    if not args.run:
        rec.add({"bundle": "not built: the ONNX Runtime GPU rows need --run (a trained run with a backbone)"})
        return None
    try:
        from edgecap.workshop.export.bundle import export_bundle

        export_bundle(args.run, target, fp16=True, overwrite=True, progress=False)
    except Exception as exc:  # noqa: BLE001
        rec.add({"bundle": f"export failed: {type(exc).__name__}: {exc}"})
        return None
    return target


def section_labert(args: SimpleNamespace, rec: Recorder) -> None:
    """(e) LaBERT mask-predict vs length-aware autoregressive models per length level: ms per caption (random
    weights; the autoregressive captions are forced to the level's longest length, as mask-predict's are)."""
    torch = torch_and_cuda(args)
    import dataclasses

    from edgecap.runtime.decoding import DecodeCfg, decode
    from edgecap.runtime.decoding.config import RadixSpec
    from edgecap.workshop.models import EDGE_WORD_VOCAB_SIZE, create_model, edge_settings, family_hooks, get_model_cfg
    from edgecap.workshop.torch_runtime.refine import TorchRefineModel

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
            inputs = {k: v.to(args.device) for k, v in synthetic_inputs(batch, model.feature_dim).items()}
            levels = getattr(mcfg, "levels", None) or mcfg.length_levels
            if strategy == "mask_predict":
                sm: Any = TorchRefineModel(model, args.device)
            else:
                sm = step_model(model, "fp32", mode, args.device)
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


def section_compile(args: SimpleNamespace, rec: Recorder) -> None:
    """(c3) ``step_mode="compile"`` at one batch size, if its compile time fits the budget."""
    torch_and_cuda(args)
    model, vocab, cfg, note = load_model(args.run)
    feats, _, _ = test_features(args, vocab is not None)
    if feats is None:
        feats = synthetic_inputs(64, model.feature_dim)
    rec.set(model=note)
    inputs = {k: v.to(args.device) for k, v in rows_of(feats, 0, 64).items()}
    precision = "fp16" if args.device != "cpu" else "fp32"
    for mode in ("compile", "cuda-graph"):
        row: dict[str, Any] = {"batch": 64, "precision": precision, "step_mode": mode}
        start = time.perf_counter()
        try:
            sm = step_model(model, precision, mode, args.device)
            from edgecap.runtime.decoding import decode

            decode(sm, inputs, cfg)
            row["first_decode_s"] = round(time.perf_counter() - start, 2)
            row |= time_decode(sm, inputs, cfg, args.repeats, 1, time.perf_counter() + 8)
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"
        rec.add(row)
