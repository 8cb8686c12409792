"""Statistics of a Karpathy-format caption dataset: split sizes, vocabulary, caption-length distribution.

Works on any Karpathy file (read with :func:`edgecap.workshop.data.datasets.load_karpathy`), and reports the synthetic
generator's extras (held-out pairs) when present. Length levels are LaBERT's 4-level plan (§3.1).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from edgecap.workshop.data.datasets import load_karpathy
from edgecap.workshop.data.synthetic._grammar import LENGTH_LEVELS

__all__ = ["VOCAB_MIN_COUNT", "dataset_stats", "level_name"]

VOCAB_MIN_COUNT = 5
_SPLIT_ORDER = ("train", "restval", "val", "test")
_OVERFLOW = f">{LENGTH_LEVELS[-1][1]}"


def level_name(num_words: int) -> str:
    """``"1-9"``, ``"10-14"``, ``"15-19"``, ``"20-25"``, or ``">25"`` for longer captions."""
    for low, high in LENGTH_LEVELS:
        if low <= num_words <= high:
            return f"{low}-{high}"
    return _OVERFLOW


def _ordered(counts: dict[str, int]) -> dict[str, int]:
    """Splits in the usual order (train, restval, val, test), any others after them alphabetically."""
    rank = {name: k for k, name in enumerate(_SPLIT_ORDER)}
    return {name: counts[name] for name in sorted(counts, key=lambda s: (rank.get(s, len(rank)), s))}


def _summary(values: list[int]) -> dict[str, float]:
    if not values:
        return {"min": 0, "mean": 0.0, "max": 0}
    return {"min": min(values), "mean": round(sum(values) / len(values), 3), "max": max(values)}


def _levels(lengths: list[int]) -> dict[str, int]:
    counts = Counter(level_name(n) for n in lengths)
    names = [f"{low}-{high}" for low, high in LENGTH_LEVELS] + ([_OVERFLOW] if counts[_OVERFLOW] else [])
    return {name: counts[name] for name in names}


def dataset_stats(path: str | Path) -> dict[str, Any]:
    """Summarise a dataset directory (holding ``dataset.json``) or a Karpathy JSON file.

    Returns:
        A JSON-ready dict: ``images``, ``splits`` (images per split), ``captions``, ``captions_per_split``,
        ``captions_per_image`` (min/mean/max), ``vocab_size`` (distinct training words seen at least
        ``VOCAB_MIN_COUNT`` times; all splits when there is no train split), ``distinct_words``, ``length``
        (words per caption, min/mean/max), ``length_histogram`` (words -> captions), ``level_histogram`` and
        ``train_level_fraction`` (per LaBERT length level), and ``heldout_pairs`` when the file lists them.

    Raises:
        FileNotFoundError: no such file / the directory has no ``dataset.json``.
        edgecap.workshop.data.datasets.DatasetError: malformed JSON or Karpathy fields.
    """
    path = Path(path)
    json_path = path / "dataset.json" if path.is_dir() else path
    if not json_path.is_file():
        raise FileNotFoundError(f"no dataset.json found at {json_path}")
    dataset = load_karpathy(json_path, None)

    per_split: Counter[str] = Counter()
    per_image: list[int] = []
    lengths: list[int] = []
    train_lengths: list[int] = []
    all_words: Counter[str] = Counter()
    train_words: Counter[str] = Counter()
    for record in dataset:
        per_split[record.split] += len(record.captions)
        per_image.append(len(record.captions))
        is_train = record.split in ("train", "restval")
        for caption in record.captions:
            lengths.append(len(caption))
            all_words.update(caption)
            if is_train:
                train_lengths.append(len(caption))
                train_words.update(caption)
    vocab_source = train_words if train_words else all_words
    train_levels = _levels(train_lengths)

    stats: dict[str, Any] = {
        "path": str(json_path),
        "dataset": dataset.name,
        "images": len(dataset),
        "splits": _ordered(dataset.splits()),
        "captions": len(lengths),
        "captions_per_split": _ordered(dict(per_split)),
        "captions_per_image": _summary(per_image),
        "vocab_min_count": VOCAB_MIN_COUNT,
        "vocab_size": sum(1 for c in vocab_source.values() if c >= VOCAB_MIN_COUNT),
        "distinct_words": len(all_words),
        "length": _summary(lengths),
        "length_histogram": dict(sorted(Counter(lengths).items())),
        "level_histogram": _levels(lengths),
        "train_level_fraction": {
            name: round(count / len(train_lengths), 4) if train_lengths else 0.0 for name, count in train_levels.items()
        },
    }
    with open(json_path, encoding="utf-8") as f:
        raw = json.load(f)
    if isinstance(raw, dict) and raw.get("heldout_pairs"):
        stats["heldout_pairs"] = raw["heldout_pairs"]
    return stats
