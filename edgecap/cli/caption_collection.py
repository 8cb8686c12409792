"""``edgecap caption DIR --out captions.jsonl``: the collection mode of ``edgecap caption`` (``docs/collections.md``).

Kept apart from :mod:`edgecap.cli.caption` (images named one by one, captions on stdout): here the images are
listed, captioned by worker processes (:mod:`edgecap.runtime.collections`) or on a Ray cluster, and written to a
JSONL file that ``--resume`` continues.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edgecap.cli.options import fail, option_group

__all__ = ["COLLECTION_OPTIONS", "caption_collection_command", "is_collection"]

COLLECTION_OPTIONS: Callable[[Callable], Callable] = option_group(
    click.option(
        "--out",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Caption a collection into this JSONL file: one line per image, "
        '{"path": ..., "caption": ...} or {"path": ..., "error": ...} (docs/collections.md).',
    ),
    click.option("--recursive", "-r", is_flag=True, help="Collections: walk the directories' sub-directories too."),
    click.option(
        "--resume",
        is_flag=True,
        help="Collections: continue an --out file a stopped run left, skipping every image up to its last line; a "
        "damaged line is dropped and its image captioned again.",
    ),
    click.option(
        "--workers",
        type=click.IntRange(1),
        default=None,
        help="Collections: worker processes, each with its own captioner and its share of --threads [default: 1].",
    ),
    click.option(
        "--ray",
        "ray",
        is_flag=False,
        flag_value="auto",
        default=None,
        metavar="[ADDRESS]",
        help="Collections: caption on a Ray cluster (pip install 'edgecap[ray]'): its address, or none to start or "
        "join a local one.",
    ),
)


def is_collection(images: tuple[Path, ...], out: Path | None, ray: str | None) -> bool:
    """Collection mode: a directory among the images, or an output file (or a Ray cluster) to write to."""
    return out is not None or ray is not None or any(p.is_dir() for p in images)


def caption_collection_command(
    images: tuple[Path, ...],
    *,
    out: Path | None,
    recursive: bool,
    resume: bool,
    workers: int | None,
    ray: str | None,
    model: str,
    load: dict[str, Any],
    length_level: int | None,
    refused: dict[str, bool],
) -> None:
    """Caption ``images`` (files and directories) into ``out``; ``load`` is ``Captioner.load``'s keyword arguments
    besides the bundle, ``refused`` the flags of the other mode that were given (each an error here)."""
    from edgecap.runtime.bundle.layout import find_bundle
    from edgecap.runtime.collections import Collection, CollectionError, WorkerSpec, caption_collection

    for flag, given in refused.items():
        if given:
            fail(f"{flag} is not for collections (a directory, or --out): their lines go to the --out JSONL file")
    if out is None:
        fail("a directory is a collection: pass --out FILE.jsonl to caption it (docs/collections.md)")
    if ray is None and out.suffix.lower() == ".parquet":
        fail("a .parquet output is written by --ray; without it --out is a JSONL file (captions.jsonl)")
    try:
        collection = Collection.of(images, recursive=recursive, output=out)  # never its own output
    except CollectionError as exc:
        fail(str(exc))
    bundle = find_bundle(model)
    if bundle is None:
        fail(
            f"no bundle found for {model!r} (a bundle directory, or $EDGECAP_HOME/bundles/{model}): collections are "
            "captioned with a bundle; `edgecap export` makes one from a run"
        )
    if ray is not None:
        _caption_with_ray(collection, out, bundle, ray, resume, workers or 1, load, length_level)
        return
    spec = WorkerSpec(bundle=str(bundle), load=load, length_level=length_level)
    try:
        summary = caption_collection(collection, out, spec, workers=workers or 1, resume=resume)
    except KeyboardInterrupt:
        fail(f"interrupted: the lines in {out} are complete; --resume continues")
    except (ValueError, RuntimeError, OSError) as exc:  # JournalError, CollectionError, WorkerError, a full disk
        fail(str(exc))
    if summary.runtime:
        click.echo(f"runtime: {summary.runtime}", err=True)
    click.echo(summary.describe(out), err=True)


def _caption_with_ray(
    collection: Any,
    out: Path,
    bundle: Path,
    address: str,
    resume: bool,
    workers: int,
    load: dict[str, Any],
    length_level: int | None,
) -> None:
    from edgecap.runtime.collections.ray_job import caption_with_ray

    if out.exists() and not resume:  # before a cluster is started
        fail(f"{out} already exists: pass --resume to continue it (or choose another --out)")
    try:
        written = caption_with_ray(
            list(collection.sources),
            out,
            bundle=bundle,
            address=None if address == "auto" else address,
            recursive=collection.recursive,
            resume=resume,
            workers=workers,
            runtime=load["runtime"],
            precision=load["precision"],
            threads=load["threads"],
            beam=load["beam"],
            length_level=length_level,
        )
    except (ValueError, RuntimeError) as exc:
        fail(str(exc))
    click.echo(f"wrote {written:,} line(s) to {out}", err=True)
