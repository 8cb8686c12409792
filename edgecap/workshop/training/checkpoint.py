"""Run directories: weights in safetensors with config and vocab beside them, resumable state.

Layout of a run directory::

    RUN/config.json          model name, overrides, sizes, backbone spec, data/feature paths, training cfg
    RUN/vocab.json           the vocabulary the weights were trained with (always travels with them)
    RUN/weights.safetensors  the best weights so far (by validation CIDEr-D)
    RUN/metrics.jsonl        one JSON object per logged event
    RUN/checkpoints/last/    weights + optimiser/scheduler/RNG state for resuming

Every file is written atomically; a crash leaves the previous complete version in place.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from edgecap.runtime._io import atomic_directory, atomic_path, atomic_write_json
from edgecap.runtime.bundle.layout import CONFIG_NAME, VOCAB_NAME, WEIGHTS_NAME
from edgecap.workshop.run_layout import NotARunError as NotARunError  # the run layout's, re-exported for the trainers
from edgecap.workshop.run_layout import RunError, read_run_config
from edgecap.workshop.run_layout import run_file as run_file

CONFIG = CONFIG_NAME
VOCAB = VOCAB_NAME
WEIGHTS = WEIGHTS_NAME
METRICS = "metrics.jsonl"
STATE = "state.pt"
LAST = Path("checkpoints") / "last"


def save_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Atomic safetensors save; shared layers (ACORT) are stored once."""
    with atomic_path(path) as tmp:
        save_model(model, str(tmp))


def load_weights(model: torch.nn.Module, path: str | Path) -> None:
    path = Path(path)
    if not path.is_file():
        raise RunError(f"weights file not found: {path}")
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except Exception as exc:  # safetensors raises several types for corrupt/mismatched files
        raise RunError(f"cannot load weights from {path}: {exc}") from exc
    if missing or unexpected:
        raise RunError(
            f"weights in {path} do not match the model: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )


def rng_state() -> dict[str, Any]:
    """Torch, NumPy and Python RNG states as plain tensors/lists, loadable with ``weights_only=True``."""
    name, keys, pos, has_gauss, cached = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    version, internal, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "python": [version, list(internal), gauss],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def save_training_state(run_dir: Path, model: torch.nn.Module, state: dict[str, Any], where: Path = LAST) -> None:
    """Write weights + optimiser/scheduler/progress as one atomic directory swap (``where``: the stage's
    checkpoint directory inside the run, ``checkpoints/last`` for cross-entropy)."""
    target = run_dir / where
    with atomic_directory(target, overwrite=True) as tmp:
        save_model(model, str(tmp / WEIGHTS))
        torch.save(state, tmp / STATE)


def load_training_state(run_dir: Path, model: torch.nn.Module, where: Path = LAST) -> dict[str, Any] | None:
    """Restore the stage's last checkpoint (``where``) into ``model``; ``None`` when the run has none yet."""
    target = run_dir / where
    if not (target / STATE).is_file():
        return None
    weights = run_file(run_dir, (where / WEIGHTS).as_posix(), "the last checkpoint's weights")
    state_file = run_file(run_dir, (where / STATE).as_posix(), "the last checkpoint's state")
    try:
        load_weights(model, weights)
    except RunError as exc:
        raise RunError(f"{exc}. {_resume_choices(run_dir)}") from exc
    try:
        state = torch.load(state_file, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated/corrupt file raises RuntimeError, pickle/EOF/zip errors, ...
        raise RunError(
            f"cannot resume: the checkpoint {state_file} is corrupt or incomplete ({exc}). {_resume_choices(run_dir)}"
        ) from exc
    if not isinstance(state, dict) or not {"optimizer", "scheduler", "rng", "progress"} <= state.keys():
        raise RunError(f"cannot resume: the checkpoint {state_file} is incomplete. {_resume_choices(run_dir)}")
    return state


def _resume_choices(run_dir: Path) -> str:
    # Only one resumable checkpoint is kept (checkpoints/last, replaced atomically), so there is no older one to
    # fall back to; RUN/weights.safetensors holds the best weights but no optimiser state.
    return (
        f"Only the last checkpoint is kept, so there is no earlier one to fall back to: pass --no-resume "
        f"(train(..., resume=False)) to start {run_dir} afresh, or train into another --out"
    )


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one JSON line; a line is written with one call so a crash cannot leave half of it."""
    with open(run_dir / METRICS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def write_config(run_dir: Path, config: dict[str, Any]) -> None:
    atomic_write_json(run_dir / CONFIG, config)


def read_config(run_dir: Path) -> dict[str, Any]:
    """A run's ``config.json``, checked by the run layout (:func:`edgecap.workshop.run_layout.read_run_config`)."""
    return read_run_config(run_dir)
