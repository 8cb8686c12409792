"""The tiny training config the training tests share: ``acort-test`` (radix base 64) on the ``tiny_data`` fixture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgecap.workshop.training.config import TrainCfg

SMALL = {"radix_base": 64}


def tiny_train_cfg(tiny_data: tuple[Path, Path], out: Path, **overrides: Any) -> TrainCfg:
    """A few-second CPU run of ``acort-test``; ``overrides`` replace any field."""
    data, feats = tiny_data
    base: dict[str, Any] = dict(
        model="acort-test",
        data=str(data),
        features=str(feats),
        out=str(out),
        epochs=50,
        batch_size=8,
        lr=3e-3,
        warmup_steps=5,
        optimizer="adamw",
        vocab_min_count=1,
        model_overrides=SMALL,
        val_images=4,
        save_every_steps=2,
        device="cpu",
        seed=1,
    )
    return TrainCfg(**{**base, **overrides})
