"""Mask-predict confidence update rules (after each refinement pass), one function per rule, looked up by the
``DecodeCfg.update_rule`` name: adding a rule is one function and one entry in :data:`CONFIDENCE_UPDATES`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["CONFIDENCE_UPDATES", "UPDATE_RULES", "global_update", "original_update"]

#: ``(old confidence, new confidence, re-masked positions) -> updated confidence``, all (B, L).
ConfidenceUpdate = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def global_update(old: np.ndarray, new: np.ndarray, masked: np.ndarray) -> np.ndarray:
    """LaBERT Eq. 7: re-masked positions take the new confidence, the others the mean of old and new."""
    return np.where(masked, new, (old + new) / np.float32(2))


def original_update(old: np.ndarray, new: np.ndarray, masked: np.ndarray) -> np.ndarray:
    """Mask-predict (Ghazvininejad et al. 2019): only re-masked positions change."""
    return np.where(masked, new, old)


CONFIDENCE_UPDATES: dict[str, ConfidenceUpdate] = {"global": global_update, "original": original_update}
#: The names ``DecodeCfg.update_rule`` accepts.
UPDATE_RULES: tuple[str, ...] = tuple(CONFIDENCE_UPDATES)
