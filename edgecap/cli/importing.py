"""``edgecap import``: turn an official ACORT, ORT or ExpansionNet v2 checkpoint into an edgecap run."""

from __future__ import annotations

import json
from pathlib import Path

import click

from edgecap.workshop.interop.sources import SOURCES


@click.command("import")
@click.option(
    "--from", "source", type=click.Choice(list(SOURCES)), required=True, help="Which official code trained it."
)
@click.argument("checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--vocab",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Official vocabulary: ACORT tokenizer/word.vocab, ORT cocotalk.json or infos_*.pkl, "
    "ExpansionNet demo_coco_tokens.pickle.",
)
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Run directory to create.")
@click.option(
    "--trust-pickle",
    is_flag=True,
    help="Allow files that hold pickled Python objects. Unpickling can run arbitrary code: only for trusted files.",
)
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@click.option(
    "--max-words", type=click.IntRange(min=1), default=None, help="Decoding cap [default: the official code's]."
)
@click.option(
    "--share-att",
    type=click.Choice(["kv", "qk"]),
    default="kv",
    show_default=True,
    help="ACORT: what 3 projections per attention are (Share-KV or Share-QK).",
)
@click.option(
    "--heads", type=click.IntRange(min=1), default=8, show_default=True, help="ExpansionNet: attention heads."
)
@click.option("--enc-groups", default=None, help="ExpansionNet: static expansion lengths [default: 32,64,128,256,512].")
@click.option(
    "--feature-dim",
    type=click.IntRange(min=1),
    default=None,
    help="Input feature width, when no official backbone gives it (features of your own) [default: the official "
    "backbone's: 2048 bottom-up regions for ORT/ACORT, 1536 Swin-L for ExpansionNet].",
)
def importing(
    source: str,
    checkpoint: Path,
    vocab: Path | None,
    out: Path,
    trust_pickle: bool,
    overwrite: bool,
    max_words: int | None,
    share_att: str,
    heads: int,
    enc_groups: str | None,
    feature_dim: int | None,
) -> None:
    """Convert an official CHECKPOINT into the run directory OUT (weights, config, vocab) that `edgecap eval`,
    `caption`, `export` and `bench` take. See docs/import.md."""
    from edgecap.cli.options import check_out
    from edgecap.workshop.interop import CheckpointError, import_checkpoint, parse_groups

    check_out(out, existing="replace" if overwrite else "refuse", atomic=True)
    options: dict[str, object] = {} if feature_dim is None else {"feature_dim": feature_dim}
    try:
        if source == "acort":
            options["share_att"] = share_att
        if source == "expansionnet-v2":
            options.update(heads=heads, enc_groups=parse_groups(enc_groups))
        run = import_checkpoint(
            source, checkpoint, out, vocab=vocab, trust_pickle=trust_pickle, overwrite=overwrite,
            max_words=max_words, **options,
        )  # fmt: skip
    except CheckpointError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"imported {source} checkpoint {checkpoint} -> {run}")
    config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    click.echo(f"model {config['model']['name']} overrides {config['model']['overrides'] or '{}'}")
    if config.get("backbone"):
        click.echo(f"backbone {config['backbone']['name']}: pass --backbone-weights {run / 'backbone.safetensors'}")
