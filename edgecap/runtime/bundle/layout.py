"""Where bundles and training runs live, what their files are called, and how a directory is told apart.

One torch-free module owns the layout both halves read: the bundle reader (:mod:`edgecap.runtime.bundle.reader`),
:meth:`edgecap.Captioner.load`, the run loader and the training checkpoints (:mod:`edgecap.workshop.runs`,
:mod:`edgecap.workshop.training.checkpoint`). Nothing is verified here: :func:`edgecap.runtime.bundle.load_bundle`
verifies a bundle, :func:`edgecap.workshop.runs.load_run` a run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgecap.runtime._home import edgecap_home
from edgecap.runtime.bundle.manifest import MANIFEST_NAME, bundle_file

__all__ = [
    "CONFIG_NAME",
    "RUN_KEYS",
    "VOCAB_NAME",
    "WEIGHTS_NAME",
    "NotARunError",
    "RunError",
    "default_bundle_dir",
    "default_run_dir",
    "describe_directory",
    "directory_kind",
    "find_bundle",
    "is_bundle",
    "read_run_config",
    "resolve_run",
    "run_file",
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


class RunError(ValueError):
    """A run directory is missing, incomplete or inconsistent."""


class NotARunError(RunError):
    """The directory is not a training run: a bundle, a half-copied bundle, or neither (the message says which)."""


def default_run_dir(model_name: str) -> Path:
    """Where ``edgecap train --model NAME`` writes by default and where a bare name is looked up:
    ``$EDGECAP_HOME/runs/NAME``."""
    return edgecap_home() / "runs" / model_name


def resolve_run(name_or_path: str | Path) -> Path:
    """A run directory from a path, or from a model name trained earlier with ``edgecap train``/``quickstart``."""
    path = Path(name_or_path)
    if is_bundle(path):
        raise NotARunError(describe_directory(path, "run"))
    if (path / CONFIG_NAME).is_file():
        return path
    candidate = default_run_dir(str(name_or_path))
    if (candidate / CONFIG_NAME).is_file():
        return candidate
    raise RunError(
        f"no trained run found for {str(name_or_path)!r}: looked for {path / CONFIG_NAME} and "
        f"{candidate / CONFIG_NAME}. Train one with `edgecap train --model {name_or_path}` (or `edgecap quickstart`), "
        "or pass a run directory."
    )


def run_file(run_dir: str | Path, name: str, where: str) -> Path:
    """``run_dir / name`` under the bundles' one path rule (:func:`edgecap.runtime.bundle.manifest.bundle_file`): a
    relative path inside the run directory that stays inside it once symlinks are resolved; else RunError."""
    return bundle_file(run_dir, name, f"{run_dir}: {where}", error=RunError, inside="the run directory")


def read_run_config(run_dir: str | Path) -> dict[str, Any]:
    """A run's ``config.json``; NotARunError when the directory is a bundle or its config has not the run's
    sections (:data:`RUN_KEYS`)."""
    path = Path(run_dir) / CONFIG_NAME
    if is_bundle(run_dir):
        raise NotARunError(describe_directory(run_dir, "run"))
    if not path.is_file():
        raise NotARunError(f"{run_dir} is not an edgecap run: {CONFIG_NAME} is missing")
    try:
        config = json.loads(run_file(run_dir, CONFIG_NAME, CONFIG_NAME).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RunError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict) or any(key not in config for key in RUN_KEYS):
        raise NotARunError(describe_directory(run_dir, "run"))
    return config
