"""DecodeCfg validation and round-trips."""

from __future__ import annotations

import json

import pytest

from edgecap.runtime.decoding import DecodeCfg, DecodeCfgError, RadixSpec, build_processors
from edgecap.runtime.decoding.config import MAX_BEAM
from edgecap.runtime.decoding.processors import ForbidTokens, MinLength, NoRepeatNGram
from edgecap.runtime.decoding.radix import RadixConstraint


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"strategy": "nucleus"}, "strategy"),
        ({"max_len": 0}, "max_len"),
        ({"min_len": 5, "max_len": 5}, "min_len"),
        ({"n_best": 4, "beam_size": 3}, "n_best"),
        ({"length_penalty": "gnmt"}, "length_penalty"),
        ({"eos_id": 0}, "pad_id"),
        ({"forbid_tokens": (2,)}, "forbid_tokens"),
        ({"top_k": -1}, "top_k"),
        ({"beam_size": MAX_BEAM + 1}, "MAX_BEAM"),
    ],
)
def test_invalid_fields_are_named(change: dict, field: str) -> None:
    with pytest.raises(DecodeCfgError, match=field):
        DecodeCfg(**change)


def test_json_round_trip_with_radix() -> None:
    cfg = DecodeCfg(
        strategy="sample", radix=RadixSpec(768, 2, 9998), pad_id=0, bos_id=769, eos_id=770, forbid_tokens=(5,)
    )
    again = DecodeCfg.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg


def test_unknown_keys_are_rejected_by_name() -> None:
    with pytest.raises(DecodeCfgError, match="beam_width"):
        DecodeCfg.from_dict({"beam_width": 3})


def test_radix_ids_must_follow_the_layout() -> None:
    with pytest.raises(DecodeCfgError, match="radix base"):
        DecodeCfg(radix=RadixSpec(768, 2, 9998))


def test_for_word_vocab_reads_ids_and_suppresses_unk() -> None:
    class Word:
        kind, pad_id, bos_id, eos_id, unk_id = "word", 0, 1, 2, 3

    cfg = DecodeCfg.for_vocab(Word(), suppress_unk=True, beam_size=5, min_len=2, no_repeat_ngram=3)
    assert (cfg.pad_id, cfg.bos_id, cfg.eos_id, cfg.forbid_tokens, cfg.radix) == (0, 1, 2, (3,), None)
    kinds = [type(p) for p in build_processors(cfg)]
    assert kinds == [ForbidTokens, MinLength, NoRepeatNGram]
    assert build_processors(cfg)[0].token_ids == [0, 1, 3]


def test_for_radix_vocab_adds_the_constraint() -> None:
    class Radix:
        kind, base, digits, num_words, pad_id, bos_id, eos_id = "radix", 768, 2, 9998, 0, 769, 770

    cfg = DecodeCfg.for_vocab(Radix(), max_len=26)
    assert cfg.radix == RadixSpec(768, 2, 9998, allow_unk=True)
    assert isinstance(build_processors(cfg)[-1], RadixConstraint)
    assert DecodeCfg.for_vocab(Radix(), constrain_radix=False).radix is None


def test_max_beam_itself_is_accepted() -> None:
    assert DecodeCfg(beam_size=MAX_BEAM).beam_size == MAX_BEAM
