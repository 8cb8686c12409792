"""Writing an imported checkpoint as a normal edgecap run directory (safetensors + config + vocab), atomically."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from edgecap._version import __version__
from edgecap.runtime._io import atomic_directory, atomic_write_json
from edgecap.workshop.models import CaptionModel, get_model_cfg, list_models
from edgecap.workshop.training import checkpoint as ckpt
from edgecap.workshop.training.config import TrainCfg

__all__ = ["BackboneFile", "IMPORT_RECORD", "ImportedRun", "choose_registered", "official_max_words", "write_run"]

#: Provenance of an imported run: the source, the checkpoint's name and SHA-256, the config chosen.
IMPORT_RECORD = "import.json"


@dataclass
class BackboneFile:
    """Backbone weights (timm names) to store as ``RUN/backbone.safetensors`` and the spec that describes them
    (``Backbone.spec`` without its ``weights`` identity, which is filled in from the written file)."""

    state: Mapping[str, torch.Tensor]
    spec: dict[str, Any]
    file: str = "backbone.safetensors"


@dataclass
class ImportedRun:
    """Everything an importer produced: the loaded model, its registered name and overrides, the vocabulary."""

    model: CaptionModel
    name: str
    overrides: dict[str, Any]
    feature_dim: int
    vocab: Any
    max_words: int
    source: str
    notes: list[str] = field(default_factory=list)
    backbone: BackboneFile | None = None


def official_max_words(max_tokens: int, tokens_per_word: int) -> int:
    """The run's ``max_words`` that reproduces an official decoder's cap of ``max_tokens`` generated tokens (EOS
    counted among them, BOS not).

    edgecap decodes ``max_words · tokens_per_word + 1`` tokens (the words and their EOS). With one token per word that
    is ``max_tokens - 1`` words: the same ``max_tokens`` tokens, so an unfinished caption has ``max_tokens`` words as
    in the official code, not one more. With radix digits a word cannot be cut, so the cap is the official number of
    complete words, ``max_tokens // tokens_per_word`` (ACORT: 26 tokens, 2 digits -> 13 words).
    """
    if max_tokens < 2 or tokens_per_word < 1:
        raise ValueError(f"max_tokens must be >= 2 and tokens_per_word >= 1, got {max_tokens}, {tokens_per_word}")
    return max_tokens - 1 if tokens_per_word == 1 else max(1, max_tokens // tokens_per_word)


def choose_registered(cfg: Any, fallback: str) -> tuple[str, dict[str, Any]]:
    """The registered reference config equal to ``cfg`` (``feature_dim`` aside, which the run records on its own),
    else ``fallback`` plus the fields that differ, as JSON-ready overrides."""
    plain = {k: v for k, v in cfg.to_dict().items() if k != "feature_dim"}
    for name in list_models("*-ref"):
        candidate = get_model_cfg(name)
        if (
            candidate.family == cfg.family
            and {k: v for k, v in candidate.to_dict().items() if k != "feature_dim"} == plain
        ):
            return name, {}
    base = get_model_cfg(fallback).to_dict()
    return fallback, {k: v for k, v in plain.items() if base.get(k) != v}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_run(imported: ImportedRun, checkpoint: Path, out: str | Path, overwrite: bool = False) -> Path:
    """Write ``imported`` to ``out`` as a run directory that ``edgecap eval/caption/export/bench`` take.

    Files: ``weights.safetensors``, ``vocab.json``, ``config.json``, ``import.json`` and, for an end-to-end
    checkpoint, ``backbone.safetensors`` (its spec, with the file's SHA-256, goes into ``config.json``). The
    directory is built beside ``out`` and renamed into place only when complete.
    """
    out = Path(out)
    model = imported.model
    with atomic_directory(out, overwrite=overwrite) as tmp:
        imported.vocab.save(tmp / ckpt.VOCAB)
        ckpt.save_weights(model, tmp / ckpt.WEIGHTS)
        backbone_spec = None
        if imported.backbone is not None:
            target = tmp / imported.backbone.file
            save_file({k: v.contiguous() for k, v in imported.backbone.state.items()}, str(target))
            identity = {"source": "file", "file": imported.backbone.file, "sha256": _sha256(target)}
            backbone_spec = {**imported.backbone.spec, "weights": identity}
        train = TrainCfg(model=imported.name, model_overrides=dict(imported.overrides), max_words=imported.max_words)
        config = {
            "edgecap_version": __version__,
            "model": {
                "name": imported.name,
                "vocab_size": imported.vocab.size,
                "feature_dim": imported.feature_dim,
                "overrides": dict(imported.overrides),
                "cfg": model.cfg.to_dict(),
                "parameters": sum(p.numel() for p in model.parameters()),
            },
            "train": train.to_dict(),
            "data": "",
            "features": "",
            "backbone": backbone_spec,
            "vocab": {"kind": imported.vocab.kind, "size": imported.vocab.size},
            "imported": {"from": imported.source, "checkpoint": checkpoint.name},
        }
        ckpt.write_config(tmp, config)
        atomic_write_json(
            tmp / IMPORT_RECORD,
            {
                "from": imported.source,
                "checkpoint": str(checkpoint),
                "checkpoint_sha256": _sha256(checkpoint),
                "model": imported.name,
                "overrides": dict(imported.overrides),
                "notes": list(imported.notes),
            },
        )
    return out
