"""What a captioner decodes with and what it answers: ``decode_cfg_for``, the default length level, the checks of a
per-call ``beam`` and ``length_level``, and :class:`Caption`, one image's reply.

Captioning a torch model's feature bank is the workshop half's (:mod:`edgecap.workshop.torch_runtime.captioning`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgecap.runtime.backends.registry import CaptionerError
from edgecap.runtime.decoding import DecodeCfg

if TYPE_CHECKING:
    from edgecap.runtime.bundle import Bundle
    from edgecap.runtime.decoding import Hypothesis
    from edgecap.runtime.vocab_base import Vocabulary

__all__ = [
    "DEFAULT_LENGTH_LEVEL",
    "NO_BEAM_SEARCH",
    "Caption",
    "bundle_decode_cfg",
    "caption_of",
    "captions_from_hypotheses",
    "check_beam",
    "check_beam_applies",
    "check_length_level",
    "decode_cfg_for",
    "decoding_overrides",
    "default_length_level",
    "with_options",
]

#: The level a LaBERT model is validated at when none is given: 10–14 words, the paper's "normal" range (§4.3).
DEFAULT_LENGTH_LEVEL = 2

#: What ``Captioner.load``/``from_run`` and ``edgecap caption`` say when a beam is asked of a mask-predict model.
NO_BEAM_SEARCH = (
    "this model decodes by mask-predict (LaBERT): it refines one caption in place, so a beam does not apply; leave "
    "beam unset (--beam off) and choose the caption's length with length_level (--length-level)"
)


@dataclass(frozen=True)
class Caption:
    """One image's caption, as :meth:`Captioner.caption <edgecap.runtime.captioner.Captioner.caption>` returns it.

    Attributes:
        text: the caption, words joined by single spaces.
        tokens: the token ids the search chose, without BOS and EOS (plain ints in a tuple: hashable, comparable with
            ``==``, and what a served reply carries); ``vocab.decode(tokens)`` gives the words of ``text``.
        score: the search's ranking score of the caption: the sum of its token log-probs, after the length penalty
            of a beam search (mask-predict: its refinement score).
        finished: True when the caption ended with end-of-sentence, False when the length limit cut it.
    """

    text: str
    tokens: tuple[int, ...]
    score: float
    finished: bool = True


def caption_of(vocab: Vocabulary, hypothesis: Hypothesis) -> Caption:
    """The :class:`Caption` of a decoded :class:`~edgecap.runtime.decoding.Hypothesis`."""
    tokens = tuple(int(t) for t in hypothesis.tokens)
    text = " ".join(vocab.decode(list(tokens)))
    return Caption(text, tokens, float(hypothesis.score), bool(hypothesis.finished))


def default_length_level(levels: Sequence[object]) -> int | None:
    """The level used when a caller gives none: :data:`DEFAULT_LENGTH_LEVEL`, or the last level of a shorter plan;
    None for a model without length levels."""
    return min(DEFAULT_LENGTH_LEVEL, len(levels)) if levels else None


def decoding_overrides(decoding: str, levels: Sequence[object]) -> dict[str, str | int]:
    """``decode_cfg_for`` overrides for how a model decodes (a bundle's ``interface["decoding"]``, an
    ``ExportSpec.decoding``): mask-predict at the default level, or the default level of a length-aware
    autoregressive model, or nothing."""
    level = default_length_level(levels)
    if decoding == "mask_predict":
        return {"strategy": "mask_predict", "length_level": level or DEFAULT_LENGTH_LEVEL}
    return {} if level is None else {"length_level": level}


def decode_cfg_for(vocab: Vocabulary, beam_size: int = 3, max_words: int = 25, **overrides: Any) -> DecodeCfg:
    """The decoding config for a vocab: greedy at beam 1, radix digits constrained, room for ``max_words`` words.

    ``strategy="mask_predict"`` (LaBERT) ignores ``beam_size``; the caption length comes from ``length_level``.
    """
    if overrides.get("strategy") == "mask_predict":
        return DecodeCfg.for_vocab(vocab, max_len=max_words * vocab.tokens_per_word + 1, **overrides)
    strategy = "greedy" if beam_size == 1 else "beam"
    max_len = max_words * vocab.tokens_per_word + 1
    return DecodeCfg.for_vocab(vocab, strategy=strategy, beam_size=beam_size, max_len=max_len, **overrides)


def bundle_decode_cfg(bundle: Bundle, vocab: Vocabulary, beam: int, length_level: int | None = None) -> DecodeCfg:
    """The production ``DecodeCfg`` of a bundle: its decoding (beam search, or mask-predict for LaBERT) at
    ``length_level``, default the level recorded at export for length-controllable bundles (``cap(image)`` then
    needs no level)."""
    overrides: dict[str, str | int] = {}
    if bundle.decoding == "mask_predict":
        overrides["strategy"] = "mask_predict"
    level = length_level if length_level is not None else bundle.default_length_level
    if level is not None:
        overrides["length_level"] = int(level)
    return decode_cfg_for(vocab, beam_size=beam, max_words=bundle.max_words, **overrides)


def with_options(cfg: DecodeCfg, beam: int | None, length_level: int | None) -> DecodeCfg:
    """``cfg`` at a (checked) beam and length level; None keeps the config's. Mask-predict refines one hypothesis
    whatever the beam (only ``beam=1`` passes :func:`check_beam_applies` for it)."""
    if beam is not None and cfg.strategy != "mask_predict":
        cfg = cfg.replace(strategy="greedy" if beam == 1 else "beam", beam_size=beam)
    if length_level is not None:
        cfg = cfg.replace(length_level=length_level)
    return cfg


def captions_from_hypotheses(vocab: Vocabulary, hypotheses: Sequence[Sequence[Hypothesis]]) -> list[str]:
    """The best hypothesis of each image as text."""
    return [" ".join(vocab.decode(hyps[0].tokens)) for hyps in hypotheses]


# -- the checks of a call's options ------------------------------------------------------------------------------------
def check_beam(beam: object) -> int:
    """Refuse a beam that is not an integer in ``1..MAX_BEAM`` (:class:`CaptionerError`, a ``ValueError``); returns
    it, typed."""
    from edgecap.runtime.decoding.config import MAX_BEAM

    if isinstance(beam, bool) or not isinstance(beam, int) or not 1 <= beam <= MAX_BEAM:
        raise CaptionerError(f"beam must be an integer in 1..{MAX_BEAM} (MAX_BEAM), got {beam!r}")
    return beam


def check_beam_applies(beam: int | None, decoding: str | None) -> None:
    """Refuse an explicit beam above 1 for a model that does not search (mask-predict), instead of ignoring it."""
    if decoding == "mask_predict" and beam is not None and beam != 1:
        raise CaptionerError(f"beam={beam}: {NO_BEAM_SEARCH}")


def check_length_level(decoder: object, level: object, known: Sequence[tuple[int, int]] = ()) -> None:
    """A clear :class:`~edgecap.runtime.length.LengthLevelError` (a ``ValueError``) for a level out of range, or for
    a model without length control (LaBERT §3.1). ``known``: the model's ``(L_low, L_high)`` ranges where the
    decoder cannot tell (an ONNX ``*-len`` encoder)."""
    from edgecap.runtime.length import NO_LENGTH_CONTROL, LengthLevelError, check_level

    levels = getattr(decoder, "length_levels", None) or known or None
    if levels is None:
        levels = getattr(getattr(decoder, "model", None), "length_levels", None)
    if levels is None and "length_level" not in _encoder_inputs(decoder):
        raise LengthLevelError(NO_LENGTH_CONTROL)
    if levels:
        check_level(tuple(levels), level)
    elif isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise LengthLevelError(f"length_level must be an integer >= 1, got {level!r}")


def _encoder_inputs(decoder: object) -> tuple[str, ...]:
    encoder = getattr(decoder, "encoder", None)
    try:
        return tuple(encoder.input_metadata()) if encoder is not None else ()
    except Exception:  # an inactive runtime: nothing to learn from it
        return ()
