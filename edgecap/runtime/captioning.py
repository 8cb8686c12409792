"""Turning visual features into caption strings with the shared decoding package.

The decoding defaults (``decode_cfg_for``, the default length level, hypotheses -> strings) are on the runtime side
and import no torch; the helpers that caption a torch model's feature bank import torch and the training batches
only when called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from edgecap.runtime.decoding import DecodeCfg, decode

if TYPE_CHECKING:
    import torch

    from edgecap.build.training.batches import FeatureBank, VisualBatch

#: The level a LaBERT model is validated at when none is given: 10–14 words, the paper's "normal" range (§4.3).
DEFAULT_LENGTH_LEVEL = 2


def default_length_level(levels: Sequence[Any]) -> int | None:
    """The level used when a caller gives none: :data:`DEFAULT_LENGTH_LEVEL`, or the last level of a shorter plan;
    None for a model without length levels."""
    return min(DEFAULT_LENGTH_LEVEL, len(levels)) if levels else None


def decoding_overrides(decoding: str, levels: Sequence[Any]) -> dict[str, Any]:
    """``decode_cfg_for`` overrides for how a model decodes (a bundle's ``interface["decoding"]``, an
    ``ExportSpec.decoding``): mask-predict at the default level, or the default level of a length-aware
    autoregressive model, or nothing."""
    level = default_length_level(levels)
    if decoding == "mask_predict":
        return {"strategy": "mask_predict", "length_level": level or DEFAULT_LENGTH_LEVEL}
    return {} if level is None else {"length_level": level}


def decode_cfg_for(vocab: Any, beam_size: int = 3, max_words: int = 25, **overrides: Any) -> DecodeCfg:
    """The decoding config for a vocab: greedy at beam 1, radix digits constrained, room for ``max_words`` words.

    ``strategy="mask_predict"`` (LaBERT) ignores ``beam_size``; the caption length comes from ``length_level``.
    """
    if overrides.get("strategy") == "mask_predict":
        return DecodeCfg.for_vocab(vocab, max_len=max_words * vocab.tokens_per_word + 1, **overrides)
    strategy = "greedy" if beam_size == 1 else "beam"
    max_len = max_words * vocab.tokens_per_word + 1
    return DecodeCfg.for_vocab(vocab, strategy=strategy, beam_size=beam_size, max_len=max_len, **overrides)


def captions_from_hypotheses(vocab: Any, hypotheses: Sequence[Sequence[Any]]) -> list[str]:
    return [" ".join(vocab.decode(hyps[0].tokens)) for hyps in hypotheses]


def caption_visual(step_model: Any, visual: VisualBatch, vocab: Any, cfg: DecodeCfg) -> list[str]:
    """Captions for one padded batch of features through any :class:`~edgecap.runtime.decoding.StepModel`."""
    return captions_from_hypotheses(vocab, decode(step_model, visual.as_inputs(), cfg))


def decoder_for(model: torch.nn.Module, device: torch.device | str = "cpu") -> Any:
    """The torch adapter decoding drives, named by the model's family (``FamilyHooks.torch_decoder``: a
    ``TorchRefineModel`` for LaBERT, a ``TorchStepModel`` for the autoregressive families)."""
    from edgecap.build.models import family_hooks

    return family_hooks(model).resolve("torch_decoder")(model, device=device)


def model_decoding_overrides(model: Any) -> dict[str, Any]:
    """``decode_cfg_for`` overrides for a torch model: its family's decoding (``FamilyHooks.decoding``) at the
    default length level of its length levels, if it has any."""
    from edgecap.build.models import family_hooks

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
