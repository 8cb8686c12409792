"""Learning-rate schedules as LambdaLR multipliers."""

from __future__ import annotations

import math
from collections.abc import Callable


def noam(d_model: int, warmup_steps: int, factor: float = 1.0) -> Callable[[int], float]:
    """The Transformer schedule used by ORT/ACORT: factor · d^-0.5 · min(s^-0.5, s · w^-1.5) (Vaswani §5.3)."""

    def fn(step: int) -> float:
        s = max(step, 1)
        return factor * d_model**-0.5 * min(s**-0.5, s * warmup_steps**-1.5)

    return fn


def warmup_cosine(warmup_steps: int, total_steps: int, floor: float = 0.0) -> Callable[[int], float]:
    """Linear warm-up then cosine decay to ``floor`` (LaBERT §4.1 uses warm-up + cosine with AdamW)."""

    def fn(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(warmup_steps, 1)
        progress = min(1.0, (step - warmup_steps) / max(total_steps - warmup_steps, 1))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return fn


def warmup_constant(warmup_steps: int) -> Callable[[int], float]:
    """Linear warm-up then a constant rate (RAdam needs no long warm-up; ExpansionNet v2 §4.1)."""

    def fn(step: int) -> float:
        return min(1.0, (step + 1) / max(warmup_steps, 1))

    return fn
