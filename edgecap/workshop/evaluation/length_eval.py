"""Per-level evaluation of a length-controllable run (LaBERT §4.3–4.6): decode the split once per length level,
then per level the COCO metrics (CIDEr-D, BLEU, METEOR, ROUGE-L; SPICE when available) and the control precision,
and over the levels' captions of each image the diversity of Table 4 (Div-1, Div-2, SelfCIDEr).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgecap.runtime._io import atomic_write_json
from edgecap.runtime.length import LengthLevelError

__all__ = ["evaluate_run_levels", "model_levels"]


def model_levels(model: Any) -> tuple[tuple[int, int], ...]:
    """The length levels of a LaBERT or length-aware autoregressive model; a clear error for other models."""
    levels = getattr(model, "levels", None) or getattr(model, "length_levels", None)
    if not levels:
        raise LengthLevelError(
            f"{type(model).__name__} has no length control: train a LaBERT model or a length-aware variant "
            f"(e.g. acort-xsmall-len) to evaluate per length level"
        )
    return tuple(levels)


def evaluate_run_levels(
    run: str | Path,
    split: str = "test",
    beam: int = 3,
    levels: Sequence[int] | None = None,
    data: str | Path | None = None,
    features: str | Path | None = None,
    device: str = "cpu",
    tokenizer: str = "ptb",
    metrics: tuple[str, ...] = ("bleu", "meteor", "rouge", "cider", "spice"),
    limit: int = 0,
    write: bool = True,
    **decode_overrides: Any,
) -> dict[str, Any]:
    """Score ``run`` on ``split`` at each length level (default all).

    Args:
        beam: beam size of an autoregressive model (ignored by LaBERT, which uses mask-predict).
        levels: 1-based levels to evaluate; None = every level of the model.
        decode_overrides: extra :class:`~edgecap.runtime.decoding.DecodeCfg` fields (e.g. ``refine_steps``,
        ``eos_decay``,
            ``update_rule``).

    Returns:
        ``{"levels": {level: {"range", "control_precision", "mean_words", "metrics", "decode_seconds"}},
        "diversity": {...}, ...}``; written to ``RUN/eval/<split>-levels.json`` with ``write``.
    """
    from edgecap.workshop.evaluation import evaluate_captions
    from edgecap.workshop.evaluation.length import control_precision, diversity
    from edgecap.workshop.evaluation.run_eval import load_eval_set
    from edgecap.workshop.torch_runtime.captioning import caption_bank

    ev = load_eval_set(run, split, data, features, device, limit)
    trained, records, bank = ev.trained, ev.records, ev.bank
    plan = model_levels(trained.model)
    chosen = list(range(1, len(plan) + 1)) if levels is None else list(levels)
    bad = [lv for lv in chosen if not 1 <= lv <= len(plan)]
    if bad:
        raise LengthLevelError(f"length levels {bad} are outside 1..{len(plan)} of this model ({list(plan)})")
    per_level: dict[str, Any] = {}
    by_image: dict[str, list[str]] = {i: [] for i in bank.image_ids}
    for level in chosen:
        low, high = plan[level - 1]
        started = time.monotonic()
        captions = caption_bank(
            trained.model,
            bank,
            trained.vocab,
            beam_size=beam,
            max_words=max(trained.max_words, high),
            device=device,
            length_level=level,
            **decode_overrides,
        )
        seconds = time.monotonic() - started
        predictions = dict(zip(bank.image_ids, captions, strict=True))
        for image_id, caption in predictions.items():
            by_image[image_id].append(caption)
        result = evaluate_captions(
            predictions, ev.references, train_captions=ev.train_captions, metrics=metrics, tokenizer=tokenizer
        )
        per_level[str(level)] = {
            "range": [low, high],
            "control_precision": control_precision(captions, low, high),
            "mean_words": sum(len(c.split()) for c in captions) / len(captions),
            "metrics": result.to_dict()["metrics"],
            "decode_seconds": round(seconds, 2),
            "example": captions[0],
        }
    summary = {
        "split": split,
        "images": len(records),
        "beam": beam,
        "levels": per_level,
        "diversity": diversity(by_image) if len(chosen) > 1 else None,
        "decode": {k: v for k, v in decode_overrides.items()},
    }
    if write:
        atomic_write_json(trained.path / "eval" / f"{split}-levels.json", summary)
    return summary
