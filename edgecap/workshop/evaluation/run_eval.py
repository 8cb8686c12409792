"""Scoring a trained run on a dataset split: decode every image, then the COCO caption metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecap.runtime._io import atomic_write_json


@dataclass(frozen=True)
class EvalSet:
    """What scoring a run needs, loaded once: the run, the split's records and features, references, and the
    training captions (CIDEr-D's document frequencies)."""

    trained: Any
    records: list[Any]
    bank: Any
    references: dict[str, list[str]]
    train_captions: list[str]


def load_eval_set(
    run: str | Path,
    split: str,
    data: str | Path | None = None,
    features: str | Path | None = None,
    device: str = "cpu",
    limit: int = 0,
) -> EvalSet:
    """Load ``run`` and the first ``limit`` images (0 = all) of ``split``; data/features default to the run's own.

    Raises:
        ValueError: the split has no images.
    """
    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.data.sources import open_feature_source
    from edgecap.workshop.runs import load_run
    from edgecap.workshop.training.batches import FeatureBank

    trained = load_run(run, device=device)
    dataset = load_dataset(data or trained.config["data"])
    records = dataset.split(split)[: limit or None]
    if not records:
        raise ValueError(f"split {split!r} of {dataset.name} has no images (splits: {dataset.splits()})")
    bank = FeatureBank(open_feature_source(features or trained.config["features"]), [r.image_id for r in records])
    return EvalSet(
        trained=trained,
        records=records,
        bank=bank,
        references={r.image_id: [" ".join(c) for c in r.captions] for r in records},
        train_captions=[" ".join(c) for r in dataset.split("train") for c in r.captions],
    )


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
    from edgecap.workshop.evaluation import evaluate_captions
    from edgecap.workshop.torch_runtime.captioning import caption_bank

    ev = load_eval_set(run, split, data, features, device, limit)
    trained, records, bank = ev.trained, ev.records, ev.bank
    started = time.monotonic()
    captions = caption_bank(
        trained.model, bank, trained.vocab, beam_size=beam, max_words=trained.max_words, device=device
    )
    decode_s = time.monotonic() - started
    predictions = dict(zip(bank.image_ids, captions, strict=True))
    result = evaluate_captions(
        predictions, ev.references, train_captions=ev.train_captions, metrics=metrics, tokenizer=tokenizer
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
