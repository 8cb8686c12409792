"""Where training runs live and how one is found and read: the run layout of the workshop half.

A run keeps the bundle's file names (:mod:`edgecap.runtime.bundle.layout`, which also tells a run from a bundle, so
the runtime can say which one it was given). Finding a run by name, reading its ``config.json`` and the paths inside
it are build-side knowledge: the run loader (:mod:`edgecap.workshop.runs`), the training checkpoints
(:mod:`edgecap.workshop.training.checkpoint`), export and the training commands read them here. Torch-free, so a
command can check its output directory before the training stack is imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgecap.runtime._home import edgecap_home
from edgecap.runtime.bundle.layout import CONFIG_NAME, RUN_KEYS, describe_directory, is_bundle
from edgecap.runtime.bundle.manifest import bundle_file

__all__ = ["NotARunError", "RunError", "default_run_dir", "read_run_config", "resolve_run", "run_file"]


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
