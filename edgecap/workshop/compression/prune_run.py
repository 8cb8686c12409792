"""``edgecap prune``'s work on run directories: structured pruning to a parameter target, or 2:4 sparsity, each
followed by a cross-entropy fine-tune, written as a new run whose ``config.json`` records the step
(``config["compression"]``, appended) and names the parent run, so export can compare against the FP32 parent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgecap.workshop.compression.prune import (
    PruneError,
    apply_plan,
    check_prunable,
    count_params,
    min_params,
    plan_pruning,
    taylor_importance,
)
from edgecap.workshop.compression.prune_finetune import RunData, finetune, load_run_data, write_derived_run
from edgecap.workshop.compression.sparsity import (
    SparsityError,
    apply_2to4,
    check_2to4,
    finalize_2to4,
    parse_pattern,
    sparse_layers,
    sparsity_summary,
)

__all__ = ["PruneError", "SparsityError", "check_target", "prune_run", "sparsify_run"]

#: Importance is measured on this many training batches (Molchanov et al. use a few hundred mini-batches on
#: ImageNet; captioning losses are smoother per batch, and the scores only need to rank).
IMPORTANCE_BATCHES = 8


def check_target(model: Any, target: int) -> None:
    """Refuse a target the model cannot be pruned to (before any data is read).

    Raises:
        PruneError: another family, a target at or above the model's size, or below the smallest prunable size.
    """
    check_prunable(model)
    current = count_params(model)
    if target >= current:
        raise PruneError(
            f"--target-params {target:,} is not below the model's {current:,} parameters: nothing to prune"
        )
    floor = min_params(model)
    if target < floor:
        raise PruneError(
            f"--target-params {target:,} is out of reach: one head per attention and one FFN channel per layer "
            f"leave {floor:,} parameters"
        )


def _record_metrics(metrics: list[dict[str, Any]], say: Callable[[str], None]) -> Callable[[dict[str, Any]], None]:
    def log(record: dict[str, Any]) -> None:
        metrics.append(record)
        if record.get("event") == "val" and record.get("cider_d") is not None:
            say(f"epoch {record['epoch']}: val CIDEr-D {record['cider_d'] * 100:.1f}")

    return log


def prune_run(
    run: Path,
    out: Path,
    target_params: int,
    finetune_epochs: int = 1,
    lr: float = 3e-4,
    max_steps: int = 0,
    say: Callable[[str], None] = print,
) -> Path:
    """Prune ``run``'s heads and FFN channels to at most ``target_params``, fine-tune, write the run ``out``."""
    from edgecap.workshop.runs import load_run

    parent = load_run(run)
    model = parent.model
    check_target(model, target_params)
    data = load_run_data(parent.config, parent.vocab)
    before = count_params(model)
    say(f"importance: first-order Taylor over {IMPORTANCE_BATCHES} training batches")
    model.eval()  # no dropout: the scores of one set of batches are reproducible
    batches = (b for i, b in enumerate(data.batches(0)) if i < IMPORTANCE_BATCHES)
    importance = taylor_importance(model, (data.loss(model, v, t) for v, t in batches))
    plan = plan_pruning(model, importance, target_params)
    pruned = apply_plan(model, plan)
    cfg: Any = pruned.cfg
    say(
        f"pruned {before:,} -> {count_params(pruned):,} parameters: {cfg.heads} heads per attention, FFN widths "
        f"encoder {list(cfg.enc_widths)} decoder {list(cfg.dec_widths)}"
    )
    metrics: list[dict[str, Any]] = []
    summary = finetune(pruned, data, finetune_epochs, lr, _record_metrics(metrics, say), max_steps)
    config = dict(parent.config)
    model_entry = dict(config["model"])
    overrides = dict(model_entry.get("overrides") or {})
    overrides.update(heads=cfg.heads, d_head=cfg.d_head, enc_d_ff=cfg.enc_d_ff, dec_d_ff=cfg.dec_d_ff)
    model_entry["overrides"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in overrides.items()}
    config["model"] = model_entry
    record = {
        "kind": "pruning",
        "from_params": before,
        "to_params": count_params(pruned),
        "target_params": target_params,
        "heads": {n: len(k) for n, k in plan.heads.items()},
        "ffn": {n: len(k) for n, k in plan.ffn.items()},
        "importance": "first-order Taylor |dL/d gate| per head and FFN channel (Molchanov et al. 2019; "
        f"Michel et al. 2019), {IMPORTANCE_BATCHES} training batches",
        "finetune_epochs": finetune_epochs,
        "finetune_lr": lr,
        "parent": str(Path(parent.path).resolve()),
    }
    config["compression"] = [*list(config.get("compression") or []), record]
    return _write(out, parent.path, config, pruned, metrics, summary, say)


def sparsify_run(
    run: Path,
    out: Path,
    pattern: str = "2:4",
    finetune_epochs: int = 1,
    lr: float = 3e-4,
    max_steps: int = 0,
    say: Callable[[str], None] = print,
) -> Path:
    """Mask ``run``'s Linear weights 2:4 by magnitude, fine-tune with the masks in force, write the run ``out``."""
    from edgecap.workshop.runs import load_run

    parse_pattern(pattern)
    parent = load_run(run)
    model = parent.model
    names = sparse_layers(model)
    data: RunData = load_run_data(parent.config, parent.vocab)
    sparsifier = apply_2to4(model)
    say(f"2:4 masks on {len(names)} Linear layers (torch.ao.pruning WeightNormSparsifier, blocks (1, 4), 2 zeros)")
    metrics: list[dict[str, Any]] = []
    summary = finetune(model, data, finetune_epochs, lr, _record_metrics(metrics, say), max_steps)
    finalize_2to4(sparsifier)
    broken = check_2to4(model, names)
    if broken:  # the parametrization makes this impossible; a check that the masks really survived training
        raise SparsityError(f"2:4 masks did not hold in {broken[:3]}")
    config = dict(parent.config)
    record = {
        "kind": "sparsity",
        "pattern": pattern,
        "layers": len(names),
        "layer_names": names,
        **sparsity_summary(model, names),
        "method": "magnitude 2:4 along the input (K) dimension, torch.ao.pruning WeightNormSparsifier",
        "finetune_epochs": finetune_epochs,
        "finetune_lr": lr,
        "parent": str(Path(parent.path).resolve()),
    }
    config["compression"] = [*list(config.get("compression") or []), record]
    return _write(out, parent.path, config, model, metrics, summary, say)


def _write(
    out: Path,
    parent: Path,
    config: dict[str, Any],
    model: Any,
    metrics: list[dict[str, Any]],
    summary: dict[str, Any],
    say: Callable[[str], None],
) -> Path:
    path = write_derived_run(out, Path(parent), config, model, metrics, summary)
    say(f"wrote {path}")
    return path
