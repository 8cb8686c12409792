"""Scoring a trained run on a dataset split: decode every image, then the COCO caption metrics."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from edgecap._io import atomic_write_json


def evaluate_run(
    run: str | Path,
    split: str = "test",
    beam: int = 3,
    data: str | Path | None = None,
    features: str | Path | None = None,
    device: str = "cpu",
    tokenizer: str = "ptb",
    metrics: tuple[str, ...] = ("bleu", "meteor", "rouge", "cider", "spice"),
    limit: int = 0,
    write: bool = True,
) -> tuple[Any, dict[str, str]]:
    """Decode ``split`` with beam ``beam`` and score it.

    Args:
        run: run directory or a model name trained under EDGECAP_HOME.
        data, features: override the dataset/feature paths recorded in the run.
        tokenizer: ``"ptb"`` (the COCO toolkit's Java tokenizer) or ``"simple"`` (no Java; METEOR unavailable).
        limit: score only the first ``limit`` images (0 = all).

    Returns:
        (EvalResult, predictions by image id). With ``write``, both are saved under ``RUN/eval/``.
    """
    from edgecap.captioning import caption_bank
    from edgecap.data.datasets import load_dataset
    from edgecap.data.sources import open_feature_source
    from edgecap.evaluation import evaluate_captions
    from edgecap.runs import load_run
    from edgecap.training.batches import FeatureBank

    trained = load_run(run, device=device)
    dataset = load_dataset(data or trained.config["data"])
    source = open_feature_source(features or trained.config["features"])
    records = dataset.split(split)
    if limit:
        records = records[:limit]
    if not records:
        raise ValueError(f"split {split!r} of {dataset.name} has no images (splits: {dataset.splits()})")
    bank = FeatureBank(source, [r.image_id for r in records])
    started = time.monotonic()
    captions = caption_bank(
        trained.model, bank, trained.vocab, beam_size=beam, max_words=trained.max_words, device=device
    )
    decode_s = time.monotonic() - started
    predictions = dict(zip(bank.image_ids, captions, strict=True))
    references = {r.image_id: [" ".join(c) for c in r.captions] for r in records}
    train_captions = [" ".join(c) for r in dataset.split("train") for c in r.captions]
    result = evaluate_captions(
        predictions, references, train_captions=train_captions, metrics=metrics, tokenizer=tokenizer
    )
    if write:
        out_dir = trained.path / "eval"
        stem = f"{split}-beam{beam}"
        atomic_write_json(
            out_dir / f"{stem}.json",
            {
                "split": split,
                "beam": beam,
                "images": len(records),
                "decode_seconds": round(decode_s, 2),
                "metrics": result.to_dict(),
            },
        )
        atomic_write_json(out_dir / f"{stem}-captions.json", predictions)
    return result, predictions
