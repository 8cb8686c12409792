"""Reproducible training: the same weights for the same seed, thread count and machine type, whatever the load.

Float sums come out differently when a reduction is split over a different number of threads, so the thread count
is part of what a result depends on: it is set explicitly (:data:`TRAIN_THREADS_ENV`, ``--threads``, or torch's own
default, the physical core count, which does not follow load), never left to a runtime that could adapt it to load
(``OMP_DYNAMIC``/``MKL_DYNAMIC`` are turned off for runtimes not started yet). Kernels with a deterministic variant
are made to use it (``torch.use_deterministic_algorithms``; cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG``).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

__all__ = ["TRAIN_THREADS_ENV", "make_deterministic", "train_threads"]

#: Environment setting: torch intra-op threads for training and feature extraction (a positive integer).
TRAIN_THREADS_ENV = "EDGECAP_TRAIN_THREADS"


def train_threads(requested: int = 0) -> int:
    """The intra-op thread count: ``requested``, else :data:`TRAIN_THREADS_ENV`, else torch's current setting."""
    if requested:
        return int(requested)
    text = os.environ.get(TRAIN_THREADS_ENV, "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{TRAIN_THREADS_ENV} must be a positive integer, got {text!r}")
        return int(text)
    return torch.get_num_threads()


def make_deterministic(threads: int = 0, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Fix the thread count and ask for deterministic kernels; returns what was set (for the run's record)."""
    for name in ("OMP_DYNAMIC", "MKL_DYNAMIC"):
        os.environ.setdefault(name, "FALSE")
    if torch.device(device).type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    count = train_threads(threads)
    torch.set_num_threads(count)
    with contextlib.suppress(RuntimeError):  # only before the first parallel region; later its value stays fixed
        torch.set_num_interop_threads(1)
    # warn_only: an op without a deterministic variant warns instead of stopping a training run
    torch.use_deterministic_algorithms(True, warn_only=True)
    return {"threads": count, "interop_threads": torch.get_num_interop_threads(), "deterministic_algorithms": True}
