"""Where bundles live, what their files are called, and how a directory is told apart from a training run.

The bundle reader (:mod:`edgecap.runtime.bundle.reader`), :meth:`edgecap.Captioner.load` and the front ends read
this layout; the workshop half builds on it (a run keeps the same file names). Telling a run from a bundle is here
because the runtime says which one it was given; where runs live and how they are found and read is the workshop
half's (:mod:`edgecap.workshop.run_layout`). Nothing is verified here: :func:`edgecap.runtime.bundle.load_bundle`
verifies a bundle.
"""

from __future__ import annotations

import json
from pathlib import Path

from edgecap.runtime._home import edgecap_home
from edgecap.runtime.bundle.manifest import MANIFEST_NAME

__all__ = [
    "CONFIG_NAME",
    "RUN_KEYS",
    "VOCAB_NAME",
    "WEIGHTS_NAME",
    "default_bundle_dir",
    "describe_directory",
    "directory_kind",
    "find_bundle",
    "is_bundle",
]

CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.json"
WEIGHTS_NAME = "weights.safetensors"


#: The sections a training run's ``config.json`` always has (``edgecap.workshop.training.loop`` writes them); a bundle's
#: ``config.json`` has no ``train`` section.
RUN_KEYS = ("model", "train")


def is_bundle(path: str | Path) -> bool:
    """Whether ``path`` is a directory with a bundle manifest (nothing is verified)."""
    return (Path(path) / MANIFEST_NAME).is_file()


def directory_kind(path: str | Path) -> str:
    """What a directory is, without guessing: ``"bundle"`` (it has ``manifest.json``), ``"run"`` (its
    ``config.json`` is a JSON object with the run's sections :data:`RUN_KEYS`), ``"config-only"`` (a
    ``config.json`` that is neither: a half-copied bundle, or another tool's file), ``"missing"`` (not a directory)
    or ``"neither"``. Nothing is verified."""
    path = Path(path)
    if not path.is_dir():
        return "missing"
    if is_bundle(path):
        return "bundle"
    config = path / CONFIG_NAME
    if not config.is_file():
        return "neither"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):  # ValueError: bad JSON, a too-long number
        return "config-only"
    if isinstance(data, dict) and all(key in data for key in RUN_KEYS):
        return "run"
    return "config-only"


def describe_directory(path: str | Path, expected: str) -> str:
    """A sentence saying what ``path`` is when it is not the ``expected`` kind (``"bundle"`` or ``"run"``), and what
    to use instead."""
    kind = directory_kind(path)
    if kind == "bundle":
        return (
            f"{path} is a bundle, not a training run: use Captioner.load({str(path)!r}) "
            f"(`edgecap caption IMAGE --model {path}` works with bundles)"
        )
    if kind == "run":
        return (
            f"{path} is a training run, not a bundle: use Captioner.from_run({str(path)!r}), or make a bundle of it "
            f"with `edgecap export --model {path}`"
        )
    if kind == "config-only":
        return (
            f"{path} has {CONFIG_NAME} but no {MANIFEST_NAME}: not a bundle (a half-copied bundle?) and not a "
            f"training run (no {' and '.join(repr(k) for k in RUN_KEYS)} sections)"
        )
    if kind == "missing":
        return f"{path} is not a directory: expected a {'bundle' if expected == 'bundle' else 'training run'}"
    if expected == "bundle":
        return f"{path} is not an edgecap bundle: {MANIFEST_NAME} is missing (create one with `edgecap export`)"
    return f"{path} is not an edgecap run: {CONFIG_NAME} is missing"


def default_bundle_dir(model_name: str) -> Path:
    """Where ``edgecap export --model NAME`` writes by default and where a bare name is looked up:
    ``$EDGECAP_HOME/bundles/NAME``."""
    return edgecap_home() / "bundles" / model_name


def find_bundle(name_or_path: str | Path) -> Path | None:
    """A bundle directory from a path, or from a bare model name exported earlier (``$EDGECAP_HOME/bundles/NAME``);
    None when neither is a bundle."""
    path = Path(name_or_path)
    if is_bundle(path):
        return path
    text = str(name_or_path)
    if text and not path.is_absolute() and len(path.parts) == 1 and not path.exists():
        candidate = default_bundle_dir(text)
        if is_bundle(candidate):
            return candidate
    return None
