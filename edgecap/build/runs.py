"""Finding and loading trained runs: a run directory, or a bare model name stored under EDGECAP_HOME."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecap.build.training.checkpoint import (
    CONFIG,
    VOCAB,
    WEIGHTS,
    NotARunError,
    RunError,
    load_weights,
    read_config,
    run_file,
)
from edgecap.runtime._home import edgecap_home


def default_run_dir(model_name: str) -> Path:
    return edgecap_home() / "runs" / model_name


def resolve_run(name_or_path: str | Path) -> Path:
    """A run directory from a path, or from a model name trained earlier with ``edgecap train``/``quickstart``."""
    from edgecap.runtime.bundle.reader import describe_directory, is_bundle

    path = Path(name_or_path)
    if is_bundle(path):
        raise NotARunError(describe_directory(path, "run"))
    if (path / CONFIG).is_file():
        return path
    candidate = default_run_dir(str(name_or_path))
    if (candidate / CONFIG).is_file():
        return candidate
    raise RunError(
        f"no trained run found for {str(name_or_path)!r}: looked for {path / CONFIG} and {candidate / CONFIG}. "
        f"Train one with `edgecap train --model {name_or_path}` (or `edgecap quickstart`), or pass a run directory."
    )


@dataclass
class TrainedRun:
    """A trained captioner with everything needed to use it: model, vocab, config and backbone spec."""

    path: Path
    model: Any
    vocab: Any
    config: dict[str, Any]

    @property
    def backbone_spec(self) -> dict[str, Any]:
        return self.config.get("backbone") or {}

    @property
    def max_words(self) -> int:
        return int(self.config["train"]["max_words"])


def build_model_from_config(config: dict[str, Any], vocab_size: int):
    from edgecap.build.models import create_model

    spec = config["model"]
    return create_model(
        spec["name"], vocab_size=vocab_size, feature_dim=spec["feature_dim"], **spec.get("overrides", {})
    )


def load_run(name_or_path: str | Path, device: str = "cpu", weights: str = WEIGHTS) -> TrainedRun:
    """Load a run's best weights (or ``weights=`` another file in it) into an eval-mode model."""
    from edgecap.runtime.vocab import load_vocab

    path = resolve_run(name_or_path)
    config = read_config(path)
    vocab_path = run_file(path, VOCAB, "vocabulary")
    if not vocab_path.is_file():
        raise RunError(f"{path} has no {VOCAB}: the weights cannot be decoded without their vocabulary")
    vocab = load_vocab(vocab_path)
    if vocab.size != config["model"]["vocab_size"]:
        raise RunError(
            f"{vocab_path} has {vocab.size} classes but the model in {path} was trained with "
            f"{config['model']['vocab_size']}: vocab and weights do not belong together"
        )
    model = build_model_from_config(config, vocab.size)
    load_weights(model, run_file(path, str(weights), "weights"))
    model.to(device).eval()
    return TrainedRun(path=path, model=model, vocab=vocab, config=config)
