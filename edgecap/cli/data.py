"""``edgecap data``: generate the synthetic captioning dataset and inspect any Karpathy-format dataset."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click


def _parse_splits(ctx: click.Context, param: click.Parameter, value: str) -> tuple[float, float, float]:
    try:
        parts = tuple(float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected three comma-separated numbers, got {value!r}") from None
    if len(parts) != 3:
        raise click.BadParameter(f"expected train,val,test fractions (three numbers), got {value!r}")
    return parts


@click.group()
def data() -> None:
    """Generate or inspect captioning datasets."""


@data.command("synth")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="Directory to create (images/ + dataset.json).",
)
@click.option(
    "--images",
    "num_images",
    type=click.IntRange(1, 1_000_000),
    default=2000,
    show_default=True,
    help="Number of images (at most 1,000,000).",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Random seed; the output is byte-identical for a seed.",
)
@click.option(
    "--size",
    "image_size",
    type=click.IntRange(224, 4096),
    default=256,
    show_default=True,
    help="Square image side in pixels (at most 4096).",
)
@click.option(
    "--splits", default="0.8,0.1,0.1", show_default=True, callback=_parse_splits, help="Train,val,test fractions."
)
@click.option(
    "--captions",
    "captions_per_image",
    type=click.IntRange(1, 20),
    default=5,
    show_default=True,
    help="Reference captions per image.",
)
@click.option(
    "--format",
    "image_format",
    type=click.Choice(["png", "jpg"]),
    default="png",
    show_default=True,
    help="png: lossless (~80 KB/image); jpg: quality 95 (~26 KB/image).",
)
@click.option(
    "--compositional",
    is_flag=True,
    help="Hold colour/shape pairs out of train; val/test images each contain one (listed in dataset.json).",
)
@click.option("--overwrite", is_flag=True, help="Replace OUT if it already holds a synthetic dataset.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
def synth(
    out_dir: Path,
    num_images: int,
    seed: int,
    image_size: int,
    splits: tuple[float, float, float],
    captions_per_image: int,
    image_format: str,
    compositional: bool,
    overwrite: bool,
    progress: bool,
) -> None:
    """Write the synthetic scene-captioning dataset (Karpathy format) to OUT."""
    from edgecap.cli.options import check_out
    from edgecap.workshop.data.synthetic import generate_dataset

    check_out(out_dir, existing="replace", atomic=True)
    start = time.perf_counter()
    try:
        json_path = generate_dataset(
            out_dir,
            num_images,
            seed=seed,
            image_size=image_size,
            splits=splits,
            compositional=compositional,
            overwrite=overwrite,
            progress=progress,
            captions_per_image=captions_per_image,
            image_format=image_format,
        )
    except (ValueError, FileExistsError) as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"wrote {num_images} images to {out_dir} in {time.perf_counter() - start:.1f} s; captions: {json_path}")


def _format_stats(stats: dict[str, Any]) -> str:
    lines = [f"dataset: {stats['dataset']} ({stats['path']})"]
    splits = ", ".join(f"{name} {count}" for name, count in stats["splits"].items())
    lines.append(f"images: {stats['images']} ({splits})")
    per_image = stats["captions_per_image"]
    lines.append(
        f"captions: {stats['captions']} ({per_image['mean']:.2f} per image, min {per_image['min']}, "
        f"max {per_image['max']})"
    )
    lines.append(
        f"vocabulary: {stats['vocab_size']} words seen >= {stats['vocab_min_count']} times in training captions "
        f"({stats['distinct_words']} distinct words overall)"
    )
    length = stats["length"]
    lines.append(f"words per caption: min {length['min']}, mean {length['mean']:.2f}, max {length['max']}")
    lines.append("length levels (LaBERT):   all captions      train fraction")
    total = max(stats["captions"], 1)
    for name, count in stats["level_histogram"].items():
        train = stats["train_level_fraction"].get(name, 0.0)
        lines.append(f"  {name:>6} words   {count:>8} ({100 * count / total:5.1f} %)   {100 * train:5.1f} %")
    lines.append("words per caption histogram:")
    peak = max(stats["length_histogram"].values(), default=1)
    for words, count in stats["length_histogram"].items():
        lines.append(f"  {words:>3} {count:>8}  {'#' * max(1, round(40 * count / peak))}")
    if stats.get("heldout_pairs"):
        lines.append("held-out pairs: " + ", ".join(" ".join(p) for p in stats["heldout_pairs"]))
    return "\n".join(lines)


@data.command("stats")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
def stats(path: Path, as_json: bool) -> None:
    """Print statistics of a dataset directory or Karpathy-format JSON file PATH."""
    from edgecap.workshop.data.synthetic import dataset_stats

    try:
        result = dataset_stats(path)
    except (ValueError, FileNotFoundError) as err:
        raise click.ClickException(str(err)) from None
    click.echo(json.dumps(result, indent=2) if as_json else _format_stats(result))
