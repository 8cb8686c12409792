"""``edgecap features``: extract backbone features for a dataset once, into a resumable cache that training reads."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from edgecap.cli.options import bounded_threads, check_out, fail


def default_cache_dir(data: Path, backbone: str, size: int) -> Path:
    """``DIR/features/<backbone>-<size>``, where ``DIR`` is the dataset directory (or the JSON file's folder)."""
    root = data if data.is_dir() else data.parent
    return root / "features" / f"{backbone.replace('/', '_')}-{size}"


def _resolve_device(device: str) -> str:
    from edgecap.workshop.torch_runtime.runtime import resolve_device

    try:
        return str(resolve_device(device))
    except ValueError as exc:
        fail(str(exc))
        raise  # unreachable: fail() raises


def _is_complete(cache_dir: Path) -> bool:
    try:
        return json.loads((cache_dir / "meta.json").read_text()).get("status") == "complete"
    except (OSError, ValueError, AttributeError):
        return False


@click.command("features")
@click.option(
    "--data",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="Dataset directory (with dataset.json) or a Karpathy/COCO JSON file.",
)
@click.option("--backbone", default="tf_efficientnet_lite0", show_default=True, help="timm model name.")
@click.option(
    "--size",
    type=click.IntRange(16, 4096),
    default=224,
    show_default=True,
    help="Square input size (224 or 384; at most 4096).",
)
@click.option(
    "--weights",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Local .safetensors/.pth state dict (required for backbones without packaged weights).",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Cache directory [default: DATA/features/<backbone>-<size>].",
)
@click.option("--overwrite", is_flag=True, help="Rebuild a cache made with other settings instead of refusing.")
@click.option(
    "--dtype",
    type=click.Choice(["float16", "float32"]),
    default="float16",
    show_default=True,
    help="Storage precision of the features.",
)
@click.option("--skip-bad", is_flag=True, help="Record unreadable images in meta.json and go on, instead of stopping.")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=None,
    callback=bounded_threads,
    help="Image-decoding threads [default: min(4, CPUs)]; 0 decodes in the main thread; at most 4 per CPU.",
)
def features(
    data: Path,
    backbone: str,
    size: int,
    weights: Path | None,
    batch_size: int,
    out: Path | None,
    overwrite: bool,
    dtype: str,
    skip_bad: bool,
    device: str,
    workers: int | None,
) -> None:
    """Extract and cache backbone features for every image of a dataset (resumes an interrupted run)."""
    import torch

    from edgecap.workshop.data.feature_cache import CacheBusyError, extract_features

    out = check_out(out or default_cache_dir(data, backbone, size))
    was_complete = not overwrite and _is_complete(out)
    click.echo(f"features: {backbone}@{size} → {out} (torch threads: {torch.get_num_threads()})")
    start = time.perf_counter()
    try:
        cache = extract_features(
            data,
            out,
            backbone_name=backbone,
            image_size=size,
            batch_size=batch_size,
            weights=weights,
            progress=True,
            dtype=dtype,
            skip_bad=skip_bad,
            overwrite=overwrite,
            device=_resolve_device(device),
            num_workers=workers,
        )
    # ImageError, CacheMismatchError, WeightsError and DatasetError are ValueErrors with a message naming the culprit
    except (ValueError, CacheBusyError, FileNotFoundError) as err:
        fail(str(err))
    seconds = time.perf_counter() - start
    extracted = 0 if was_complete else int(cache.meta.get("extraction", {}).get("images_extracted", 0))
    nbytes = cache.nbytes
    rate = f"{extracted / seconds:.1f} images/s" if extracted and seconds > 0 else "nothing to extract"
    click.echo(
        f"{len(cache)} images cached ({extracted} extracted now, {len(cache.skipped)} skipped) in {seconds:.1f} s, "
        f"{rate}; cache {nbytes / 1e6:.1f} MB ({nbytes / max(len(cache), 1) / 1e3:.1f} kB/image, "
        f"{cache.num_cells}x{cache.feature_dim} {cache.dtype}) at {out}"
    )
    for image_id, reason in list(cache.skipped.items())[:5]:
        click.echo(f"  skipped {image_id}: {reason}", err=True)
