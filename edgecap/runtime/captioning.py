"""The decoding defaults of a captioner: ``decode_cfg_for``, the default length level, hypotheses -> strings.

Captioning a torch model's feature bank is the workshop half's (:mod:`edgecap.workshop.torch_runtime.captioning`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgecap.runtime.decoding import DecodeCfg

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
