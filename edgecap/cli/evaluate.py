"""``edgecap eval``: COCO caption metrics for a trained run."""

from __future__ import annotations

from pathlib import Path

import click

from edgecap.cli.options import apply_threads, beam_option, device_option, fail, threads_option


@click.command("eval")
@click.argument("run")
@click.option("--split", default="test", show_default=True)
@beam_option
@click.option(
    "--data",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Dataset to score on [default: the one the run was trained on].",
)
@click.option("--features", type=click.Path(exists=True, path_type=Path), default=None)
@click.option(
    "--tokenizer",
    type=click.Choice(["ptb", "simple"]),
    default="ptb",
    show_default=True,
    help="ptb = the COCO toolkit's Java tokenizer; simple = no Java (METEOR unavailable).",
)
@click.option("--limit", type=click.IntRange(0), default=0, help="Score only the first N images.")
@click.option(
    "--length-level",
    default=None,
    metavar="N|all",
    help="Length-controllable models (LaBERT, *-len): evaluate at level N, or every level ('all'), and report "
    "control precision per level and diversity (LaBERT §4.6).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@device_option
@threads_option
def evaluate(
    run: str,
    split: str,
    beam: int,
    data: Path | None,
    features: Path | None,
    tokenizer: str,
    limit: int,
    length_level: str | None,
    as_json: bool,
    device: str,
    threads: int,
) -> None:
    """Score RUN (a run directory or a trained model name) on a dataset split."""
    apply_threads(threads)
    from edgecap.workshop.evaluation.run_eval import evaluate_run
    from edgecap.workshop.torch_runtime.runtime import resolve_device

    if length_level is not None:
        _evaluate_levels(run, split, beam, data, features, str(resolve_device(device)), tokenizer, limit, length_level)
        return
    try:
        result, _ = evaluate_run(
            run,
            split=split,
            beam=beam,
            data=data,
            features=features,
            device=str(resolve_device(device)),
            tokenizer=tokenizer,
            limit=limit,
        )
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as exc:
        fail(str(exc))
    if as_json:
        click.echo(result.to_json())
    else:
        from edgecap.workshop.evaluation import print_result

        print_result(result, title=f"{run} · {split} · beam {beam}")


def _evaluate_levels(
    run: str,
    split: str,
    beam: int,
    data: Path | None,
    features: Path | None,
    device: str,
    tokenizer: str,
    limit: int,
    level: str,
) -> None:
    import json

    from edgecap.workshop.evaluation.length_eval import evaluate_run_levels

    if level != "all" and not level.isdigit():
        fail(f"--length-level takes a level number or 'all', got {level!r}")
    levels = None if level == "all" else [int(level)]
    try:
        summary = evaluate_run_levels(
            run,
            split=split,
            beam=beam,
            levels=levels,
            data=data,
            features=features,
            device=device,
            tokenizer=tokenizer,
            limit=limit,
        )
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as exc:
        fail(str(exc))
    click.echo(json.dumps(summary, indent=2))
