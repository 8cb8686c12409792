"""``edgecap zoo``: the registered model configs with their sizes at the paper's and at edge settings."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.console import JustifyMethod

_EDGE_WORD_VOCAB_SIZE = 124  # mirrors edgecap.workshop.models.EDGE_WORD_VOCAB_SIZE without importing torch for --help


def _millions(n: float | None) -> str:
    return "—" if n is None else f"{n / 1e6:.2f}M"


@click.command("zoo")
@click.argument("pattern", default="*")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of a table.")
@click.option(
    "--vocab-size",
    type=click.IntRange(min=2),
    default=_EDGE_WORD_VOCAB_SIZE,
    show_default=True,
    help="Word-model output classes at edge settings (120 words + PAD/BOS/EOS/UNK); radix models use base+3.",
)
@click.option(
    "--feature-dim",
    type=click.IntRange(min=1),
    default=None,
    help="Visual feature channels at edge settings [default: each config's, 1280 = EfficientNet-Lite0].",
)
def zoo(pattern: str, as_json: bool, vocab_size: int, feature_dim: int | None) -> None:
    """List registered models matching PATTERN (fnmatch, e.g. 'acort-*') with parameter counts.

    "paper" counts use the papers' setting (2,048-d region features; 10,001 word ids or radix base+3 classes), so
    they can be checked against ACORT Table 1; "edge" counts use edgecap's defaults.
    """
    from edgecap.workshop.models import describe_models

    rows = describe_models(pattern, edge_vocab_size=vocab_size, edge_feature_dim=feature_dim)
    if not rows:
        raise click.ClickException(f"no registered model matches {pattern!r}")
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"edgecap models matching {pattern!r}", title_justify="left")
    columns: list[tuple[str, JustifyMethod]] = [
        ("model", "left"),
        ("d", "right"),
        ("ffn", "right"),
        ("heads", "right"),
        ("enc layers", "left"),
        ("dec layers", "left"),
        ("att share", "left"),
        ("vocab", "left"),
        ("geometry", "left"),
        ("params (paper)", "right"),
        ("reported", "right"),
        ("params (edge)", "right"),
    ]
    for header, justify in columns:
        table.add_column(header, justify=justify, no_wrap=header == "model")
    for r in rows:
        vocab = f"radix {r['radix_base']}" if r.get("vocab_kind") == "radix" else str(r.get("vocab_kind", ""))
        table.add_row(
            r["name"],
            str(r.get("d_model", "")),
            str(r.get("d_ff", "")),
            str(r.get("heads", "")),
            f"{r.get('enc_layers', '')} {r.get('enc_layer_map', '')}",
            f"{r.get('dec_layers', '')} {r.get('dec_layer_map', '')}",
            str(r.get("share_att") or "none"),
            vocab,
            "box" if r.get("geometry") else "—",
            _millions(r["params_paper"]),
            _millions(r["paper_reported"]),
            _millions(r["params_edge"]),
        )
    console = Console(width=max(160, Console().width))
    console.print(table)
    console.print(
        f"paper: {rows[0]['paper_settings']['feature_dim']}-d features, word vocab 10001 / radix base+3; "
        f"edge: feature dim {'per config' if feature_dim is None else feature_dim}, word vocab {vocab_size}. "
        "'reported' = the paper's Table 1."
    )
