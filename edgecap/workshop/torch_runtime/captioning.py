"""Captioning with a torch model: its family's decoder adapter, and caption strings for a whole feature bank.

Evaluation, bundle export's quality check and SCST caption a torch model's features here, with the same decoding
package and the same defaults (:mod:`edgecap.runtime.captioning`) every runtime uses.
"""

from __future__ import annotations

from typing import Any

import torch

from edgecap.runtime.captioning import captions_from_hypotheses, decode_cfg_for, decoding_overrides
from edgecap.runtime.decoding import DecodeCfg, decode
from edgecap.workshop.models import family_hooks
from edgecap.workshop.training.batches import FeatureBank, VisualBatch

__all__ = ["caption_bank", "caption_visual", "decoder_for", "model_decoding_overrides"]


def caption_visual(step_model: Any, visual: VisualBatch, vocab: Any, cfg: DecodeCfg) -> list[str]:
    """Captions for one padded batch of features through any :class:`~edgecap.runtime.decoding.StepModel`."""
    return captions_from_hypotheses(vocab, decode(step_model, visual.as_inputs(), cfg))


def decoder_for(model: torch.nn.Module, device: torch.device | str = "cpu") -> Any:
    """The torch adapter decoding drives, named by the model's family (``FamilyHooks.torch_decoder``: a
    ``TorchRefineModel`` for LaBERT, a ``TorchStepModel`` for the autoregressive families)."""
    return family_hooks(model).resolve("torch_decoder")(model, device=device)


def model_decoding_overrides(model: Any) -> dict[str, Any]:
    """``decode_cfg_for`` overrides for a torch model: its family's decoding (``FamilyHooks.decoding``) at the
    default length level of its length levels, if it has any."""
    return decoding_overrides(family_hooks(model).decoding, getattr(model, "length_levels", None) or ())


def caption_bank(
    model: torch.nn.Module,
    bank: FeatureBank,
    vocab: Any,
    beam_size: int = 1,
    max_words: int = 25,
    device: torch.device | str = "cpu",
    batch_size: int = 100,
    **decode_overrides: Any,
) -> list[str]:
    """Captions for every image of ``bank``, in order, decoded with the torch adapter and the family's decoding
    (mask-predict for LaBERT) at ``length_level`` — default :data:`DEFAULT_LENGTH_LEVEL`."""
    step_model = decoder_for(model, device)
    decode_overrides = {**model_decoding_overrides(model), **decode_overrides}
    cfg = decode_cfg_for(vocab, beam_size=beam_size, max_words=max_words, **decode_overrides)
    was_training = model.training
    model.eval()
    out: list[str] = []
    try:
        for start in range(0, len(bank), batch_size):
            rows = list(range(start, min(start + batch_size, len(bank))))
            out.extend(caption_visual(step_model, bank.batch(rows), vocab, cfg))
    finally:
        model.train(was_training)
    return out
