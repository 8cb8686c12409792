"""Converting an official checkpoint into an edgecap run (the work behind ``edgecap import``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edgecap.workshop.interop._reading import CheckpointError
from edgecap.workshop.interop._run import ImportedRun, write_run
from edgecap.workshop.interop.sources import SOURCES

__all__ = ["convert_checkpoint", "import_checkpoint", "parse_groups", "word_capacity"]


def _importer(source: str) -> Callable[..., ImportedRun]:
    module, _, function = SOURCES[source].partition(":")
    return getattr(importlib.import_module(module), function)


def convert_checkpoint(
    source: str, checkpoint: str | Path, vocab: str | Path | None = None, trust_pickle: bool = False, **options: Any
) -> ImportedRun:
    """Read and convert an official checkpoint without writing anything (the model is loaded, in eval mode).

    Raises:
        CheckpointError: unknown source, unreadable or mismatching files (the message names the tensor or file).
    """
    if source not in SOURCES:
        raise CheckpointError(f"unknown source {source!r}; choose one of {sorted(SOURCES)}")
    imported = _importer(source)(Path(checkpoint), None if vocab is None else Path(vocab), trust_pickle, **options)
    imported.model.eval()
    # Positions are a fixed table: BOS + the words' tokens must fit (a checkpoint with a short table caps decoding).
    imported.max_words = min(imported.max_words, word_capacity(imported))
    return imported


def word_capacity(imported: ImportedRun) -> int:
    """The most words the imported model can decode: BOS and ``tokens_per_word`` tokens per word in ``max_len``."""
    return max(1, (int(imported.model.cfg.max_len) - 1) // int(imported.vocab.tokens_per_word))


def import_checkpoint(
    source: str,
    checkpoint: str | Path,
    out: str | Path,
    vocab: str | Path | None = None,
    trust_pickle: bool = False,
    overwrite: bool = False,
    max_words: int | None = None,
    **options: Any,
) -> Path:
    """Convert an official checkpoint and write it as the run directory ``out``; returns ``out``.

    Args:
        source: ``"acort"``, ``"ort"`` or ``"expansionnet-v2"``.
        checkpoint: the official weights file.
        out: the run directory to create (refused if it exists, unless ``overwrite``).
        vocab: the official vocabulary file (ACORT ``word.vocab``, ORT ``cocotalk.json``/``infos_*.pkl``,
            ExpansionNet ``demo_coco_tokens.pickle``).
        trust_pickle: allow unpickling Python objects in the files (only for files you trust).
        max_words: decoding length cap recorded in the run (default: the official code's).
        **options: source options (``share_att`` for ACORT; ``heads``, ``enc_groups``, ``backbone`` for ExpansionNet).
    """
    imported = convert_checkpoint(source, checkpoint, vocab, trust_pickle, **options)
    if max_words is not None:
        capacity = word_capacity(imported)
        if not 1 <= max_words <= capacity:
            raise CheckpointError(f"max_words must be in [1, {capacity}] for this model's positions, got {max_words}")
        imported.max_words = int(max_words)
    if Path(out).exists() and not overwrite:
        raise CheckpointError(f"{out} already exists; choose another --out or pass --overwrite")
    return write_run(imported, Path(checkpoint), out, overwrite=overwrite)


def parse_groups(text: str | None) -> Sequence[int] | None:
    """``"32,64,128"`` -> ``(32, 64, 128)`` (the CLI's ``--enc-groups``); None stays None."""
    if text is None:
        return None
    try:
        return tuple(int(g) for g in text.replace(" ", "").split(",") if g)
    except ValueError as exc:
        raise CheckpointError(f"--enc-groups must be comma-separated integers, got {text!r}") from exc
