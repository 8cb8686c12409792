"""``Captioner.from_run``: a :class:`~edgecap.Captioner` on a training run's torch weights.

The runtime's :class:`~edgecap.Captioner` reaches this through :mod:`edgecap.runtime.torch_hooks`, so captioning
from a bundle never imports torch while captioning from a run (the quickstart, ``edgecap caption --model RUN``)
still has one entry point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgecap.runtime.captioner import Captioner, check_beam_applies
from edgecap.runtime.captioning import decode_cfg_for
from edgecap.workshop.runs import load_run
from edgecap.workshop.torch_runtime.captioning import decoder_for, model_decoding_overrides
from edgecap.workshop.torch_runtime.images import BackboneInputs, backbone_from_spec

__all__ = ["captioner_from_run"]


def captioner_from_run(
    cls: type[Captioner],
    run: str | Path,
    device: str = "cpu",
    beam: int | None = None,
    backbone_weights: str | Path | None = None,
) -> Captioner:
    """``cls`` on the run's best weights in eval mode, its backbone rebuilt and proven the same as the run's, and
    the family's decoding (LaBERT: mask-predict, §3.2) at beam ``beam`` (default 3)."""
    trained = load_run(run, device=device)
    overrides = model_decoding_overrides(trained.model)
    check_beam_applies(beam, overrides.get("strategy"))
    beam = 3 if beam is None else beam
    backbone = backbone_from_spec(trained.backbone_spec, weights=backbone_weights)
    cfg = decode_cfg_for(trained.vocab, beam_size=beam, max_words=trained.max_words, **overrides)
    info: dict[str, Any] = {"runtime": "torch", "device": str(device), "precision": "fp32", "run": str(trained.path)}
    return cls(
        BackboneInputs(backbone, device), decoder_for(trained.model, device), trained.vocab, cfg, runtime_info=info
    )
