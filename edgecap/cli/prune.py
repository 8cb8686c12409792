"""``edgecap prune``: structured pruning to a parameter budget, or 2:4 sparsity, with a short fine-tune; writes a new
run (``docs/compression.md``)."""

from __future__ import annotations

from pathlib import Path

import click

from edgecap.cli.options import FiniteFloat, apply_threads, check_apart, check_out, fail, threads_option


@click.command("prune")
@click.argument("run")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="The new run directory (must not exist).")
@click.option(
    "--target-params",
    type=click.IntRange(1),
    default=None,
    help="Structured pruning: remove attention heads and FFN channels until at most N parameters (ORT/ACORT).",
)
@click.option(
    "--sparsity",
    default=None,
    metavar="2:4",
    help="Semi-structured sparsity pattern: 2:4 (TensorRT sparse tensor cores; on CPU a size/quality result only).",
)
@click.option(
    "--finetune-epochs",
    type=click.IntRange(0),
    default=1,
    show_default=True,
    help="Cross-entropy fine-tuning epochs after pruning (the best by validation CIDEr-D is kept).",
)
@click.option(
    "--lr",
    type=FiniteFloat(min=0, min_open=True),
    default=3e-4,
    show_default=True,
    help="Fine-tune starting lr (AdamW, cosine decay to 0).",
)
@click.option("--max-steps", type=click.IntRange(0), default=0, help="Stop the fine-tune after N steps (0: no limit).")
@threads_option
def prune(
    run: str,
    out: Path,
    target_params: int | None,
    sparsity: str | None,
    finetune_epochs: int,
    lr: float,
    max_steps: int,
    threads: int,
) -> None:
    """Derive a smaller or sparser run from RUN (a run directory or a trained model name).

    \b
    edgecap prune runs/acort-small --target-params 2570000 --out runs/acort-small-pruned --finetune-epochs 3
    edgecap prune runs/acort-xsmall --sparsity 2:4 --out runs/acort-xsmall-2to4 --finetune-epochs 2
    """
    if (target_params is None) == (sparsity is None):
        fail("give exactly one of --target-params N (structured pruning) or --sparsity 2:4")
    apply_threads(threads)
    from edgecap.workshop.compression.prune_run import (
        PruneError,
        SparsityError,
        prune_run,
        sparsify_run,
    )
    from edgecap.workshop.compression.sparsity import parse_pattern
    from edgecap.workshop.run_layout import RunError

    try:
        if sparsity is not None:
            parse_pattern(sparsity)
    except SparsityError as exc:
        fail(str(exc))
    if out.exists():
        fail(f"--out {out} already exists; choose a new run directory")
    if Path(run).exists():
        check_apart(out, Path(run), f"RUN {run}")
    check_out(out, existing="refuse", atomic=True)
    say = lambda line: click.echo(line, err=True)  # noqa: E731
    try:
        if target_params is not None:
            prune_run(Path(run), out, target_params, finetune_epochs, lr, max_steps, say)
        else:
            sparsify_run(Path(run), out, str(sparsity), finetune_epochs, lr, max_steps, say)
    except (PruneError, SparsityError, RunError, FileNotFoundError) as exc:
        fail(str(exc))
