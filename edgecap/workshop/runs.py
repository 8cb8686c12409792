"""Loading trained runs (a run directory, or a bare model name stored under EDGECAP_HOME) and a bundle's torch
weights into an eval-mode model. Where runs live and how they are found is :mod:`edgecap.workshop.run_layout`'s."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgecap.runtime.bundle.layout import CONFIG_NAME
from edgecap.runtime.bundle.manifest import BundleConfigError
from edgecap.workshop.run_layout import RunError, read_run_config, resolve_run, run_file
from edgecap.workshop.training.checkpoint import VOCAB, WEIGHTS, load_weights

if TYPE_CHECKING:
    from edgecap.workshop.models.base import CaptionModel


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


def build_model_from_config(config: dict[str, Any], vocab_size: int) -> CaptionModel:
    from edgecap.workshop.models import create_model

    spec = config["model"]
    return create_model(
        spec["name"], vocab_size=vocab_size, feature_dim=spec["feature_dim"], **spec.get("overrides", {})
    )


def load_run(name_or_path: str | Path, device: str = "cpu", weights: str = WEIGHTS) -> TrainedRun:
    """Load a run's best weights (or ``weights=`` another file in it) into an eval-mode model."""
    from edgecap.runtime.vocab import load_vocab

    path = resolve_run(name_or_path)
    config = read_run_config(path)
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


def load_bundle_model(bundle: Any, device: str = "cpu") -> Any:
    """A bundle's captioner rebuilt from ``config.json`` with ``weights.safetensors`` loaded, in eval mode (the torch
    runtime, bundle export from a bundle)."""
    model = build_model_from_config(bundle.config, int(bundle.config["model"]["vocab_size"]))
    try:
        load_weights(model, bundle.file(bundle.weights_file, f"{CONFIG_NAME} weights"))
    except RunError as exc:
        raise BundleConfigError(f"bundle {bundle.path}: {exc}") from exc
    return model.to(device).eval()
