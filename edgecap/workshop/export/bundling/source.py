"""What is exported: a trained run or a bundle as an :class:`ExportSource`, and where its bundle goes by default."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from edgecap.runtime.bundle.layout import CONFIG_NAME, WEIGHTS_NAME, is_bundle
from edgecap.runtime.bundle.manifest import sha256_file
from edgecap.runtime.bundle.reader import load_bundle
from edgecap.workshop.export.bundling import BundleExportError
from edgecap.workshop.export.bundling.compression import compression_steps

__all__ = [
    "REBUILDABLE_BACKBONES",
    "ExportSource",
    "backbone_in_graph",
    "default_bundle_out",
    "load_source",
]


@dataclass
class ExportSource:
    """A trained captioner with everything a bundle records about it.

    Attributes:
        name: the model name (``acort-xsmall``).
        model: the eval-mode ``CaptionModel``.
        vocab: its vocabulary.
        model_config: the run config's ``model`` section (name, vocab size, feature dim, overrides, cfg).
        max_words: the longest caption in words (decode default).
        backbone_spec: ``Backbone.spec`` of the features the model was trained on ({} for region features).
        backbone_weights: the backbone's local weights file, when the spec says they came from a file.
        data, features: the run's dataset and feature directories (None when unknown).
        origin: where it came from, for messages and the bundle config.
        weights_sha256: SHA-256 of the run's weights file (lets a caller tell whether a bundle is up to date).
        beam: the default beam size recorded in the bundle.
        compression: the run config's ``compression`` step records (``bundling.compression``), in order; [] for
            an uncompressed run.
    """

    name: str
    model: torch.nn.Module
    vocab: Any
    model_config: dict[str, Any]
    max_words: int
    backbone_spec: dict[str, Any]
    backbone_weights: Path | None
    data: Path | None
    features: Path | None
    origin: str
    weights_sha256: str | None = None
    beam: int = 3
    compression: list[dict[str, Any]] = field(default_factory=list)

    def backbone(self) -> Any:
        """The run's backbone, rebuilt and checked against its spec (raises ``BackboneMismatchError``)."""
        from edgecap.workshop.torch_runtime.images import backbone_from_spec

        return backbone_from_spec(self.backbone_spec, weights=self.backbone_weights)

    @property
    def backbone_source(self) -> str | None:
        return (self.backbone_spec.get("weights") or {}).get("source") if self.backbone_spec else None

    @property
    def backbone_rebuildable(self) -> bool:
        """Whether the backbone the features came from can be rebuilt (packaged or file weights, not random ones)."""
        return self.backbone_source in REBUILDABLE_BACKBONES


#: Backbone weight sources a bundle can rebuild, and so put in its encoder graph.
REBUILDABLE_BACKBONES = ("packaged", "file")


def default_bundle_out(model_or_run: Any) -> Path:
    """Where ``edgecap export`` writes without ``--out``: ``$EDGECAP_HOME/bundles/NAME``, the place the quickstart
    writes and lookups by name read. ``NAME`` is the model name given, or for a run directory, a bundle or a
    :class:`~edgecap.workshop.runs.TrainedRun` the model name its config records (only ``config.json`` is read)."""
    import json

    from edgecap.runtime.bundle.layout import default_bundle_dir
    from edgecap.workshop.runs import TrainedRun

    if isinstance(model_or_run, TrainedRun):
        return default_bundle_dir(str(model_or_run.config["model"]["name"]))
    config = Path(model_or_run) / CONFIG_NAME
    if config.is_file():
        try:
            name = json.loads(config.read_text(encoding="utf-8"))["model"]["name"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BundleExportError(f"{config}: cannot read the model name ({exc}); pass --out BUNDLE") from exc
        return default_bundle_dir(str(name))
    return default_bundle_dir(str(model_or_run))


def load_source(model_or_run: Any, backbone_weights: str | Path | None = None) -> ExportSource:
    """Resolve what ``edgecap export --model`` names: a :class:`~edgecap.workshop.runs.TrainedRun`, a run directory, a
    model
    name trained earlier (``$EDGECAP_HOME/runs/NAME``), or an existing bundle (re-export, e.g. to add INT8).

    Raises:
        RunError: nothing trained under that name/path (the message says where it looked and what to do).
        BundleExportError: the run's backbone used a local weights file that was not passed.
    """
    from edgecap.workshop.runs import TrainedRun, load_bundle_model, load_run

    weights = Path(backbone_weights) if backbone_weights is not None else None
    if isinstance(model_or_run, (str, Path)) and is_bundle(model_or_run):
        bundle = load_bundle(model_or_run)
        source_info = bundle.config.get("source") or {}
        source = ExportSource(
            name=bundle.name,
            model=load_bundle_model(bundle),
            vocab=bundle.load_vocab(),
            model_config=dict(bundle.config["model"]),
            max_words=bundle.max_words,
            backbone_spec=bundle.backbone_spec,
            backbone_weights=weights or bundle.backbone_weights,
            data=_existing(source_info.get("data")),
            features=_existing(source_info.get("features")),
            origin=f"bundle {bundle.path}",
            weights_sha256=source_info.get("weights_sha256"),
            beam=bundle.beam,
            compression=compression_steps(
                (bundle.manifest.get("compression") or {}).get("steps"), f"bundle {bundle.path}: manifest.json"
            ),
        )
    else:
        run = model_or_run if isinstance(model_or_run, TrainedRun) else load_run(model_or_run)
        source = ExportSource(
            name=str(run.config["model"]["name"]),
            model=run.model,
            vocab=run.vocab,
            model_config=dict(run.config["model"]),
            max_words=run.max_words,
            backbone_spec=run.backbone_spec,
            backbone_weights=weights or _tuned_backbone_file(run),
            data=_existing(run.config.get("data")),
            features=_existing(run.config.get("features")),
            origin=f"run {run.path}",
            weights_sha256=sha256_file(run.path / WEIGHTS_NAME) if (run.path / WEIGHTS_NAME).is_file() else None,
            compression=compression_steps(run.config.get("compression"), f"{run.path / CONFIG_NAME}"),
        )
    if source.backbone_source == "file" and source.backbone_weights is None:
        file = source.backbone_spec["weights"].get("file")
        raise BundleExportError(
            f"the {source.origin} was trained on features of a backbone with local weights {file!r}: pass that file "
            "(--backbone-weights FILE) so the bundle can carry it and caption images"
        )
    source.model.eval()
    return source


def _tuned_backbone_file(run: Any) -> Path | None:
    """A run that fine-tuned its backbone (end to end, SCST, QAT) keeps it as ``RUN/backbone.safetensors`` and its
    spec names that file: export uses it when ``--backbone-weights`` is not given (the spec's SHA-256 still proves
    it is the same file)."""
    identity = (run.backbone_spec or {}).get("weights") or {}
    file = run.path / "backbone.safetensors"
    if identity.get("source") == "file" and identity.get("file") == file.name and file.is_file():
        return Path(file)
    return None


def _existing(path: str | None) -> Path | None:
    return Path(path) if path and Path(path).exists() else None


def backbone_in_graph(source: ExportSource, requested: bool | None) -> bool:
    """Whether the encoder graph takes pixels: ``requested``, or by default whenever the backbone can be rebuilt."""
    if requested is False:
        return False
    if not source.backbone_spec:
        if requested:
            raise BundleExportError(
                f"--with-backbone: the {source.origin} was trained on precomputed region features, not on a "
                "backbone's features, so there is no backbone to put in the graph"
            )
        return False
    if not source.backbone_rebuildable:
        if requested:
            raise BundleExportError(
                f"--with-backbone: the {source.origin} was trained on features of a randomly initialised backbone "
                f"({source.backbone_spec.get('name')}), which cannot be rebuilt into a graph; export with "
                "--features-in, or extract features with packaged or file weights"
            )
        return False
    return True
