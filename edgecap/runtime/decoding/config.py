"""``DecodeCfg``: everything that chooses how captions are decoded, as one frozen, JSON-serialisable dataclass."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgecap.runtime.decoding.update_rules import UPDATE_RULES

STRATEGIES = ("greedy", "beam", "sample", "mask_predict")
LENGTH_PENALTIES = ("none", "wu", "avg")
#: The largest beam size anything accepts (``DecodeCfg``, ``Captioner.load``/``from_run``, ``edgecap caption
#: --beam``, ``edgecap bench --beam``): beyond it a search costs seconds and gigabytes per image for no caption gain.
MAX_BEAM = 64


class DecodeCfgError(ValueError):
    """An invalid decoding configuration; the message names the field."""


@dataclass(frozen=True)
class RadixSpec:
    """The radix token layout a :class:`~edgecap.runtime.decoding.RadixConstraint` enforces (ACORT §4.1, reference
    layout).

    Attributes:
        base: v, digits per position; digit k is token k + 1.
        digits: d, tokens per word, most-significant digit first.
        num_words: N, word indices 0 … N−1, where N−1 is ``<unk>``.
        allow_unk: whether the ``<unk>`` index may be generated.
    """

    base: int
    digits: int
    num_words: int
    allow_unk: bool = True

    def __post_init__(self) -> None:
        if self.base < 2:
            raise DecodeCfgError(f"radix.base must be >= 2, got {self.base}")
        if self.digits < 1:
            raise DecodeCfgError(f"radix.digits must be >= 1, got {self.digits}")
        if not 1 <= self.num_words <= self.base**self.digits:
            raise DecodeCfgError(
                f"radix.num_words must be in [1, base**digits = {self.base**self.digits}], got {self.num_words}"
            )


@dataclass(frozen=True)
class DecodeCfg:
    """How to decode.

    Attributes:
        strategy: ``"greedy"``, ``"beam"`` or ``"sample"``.
        max_len: maximum number of generated tokens per caption, EOS included (ACORT's ``seq_length``: 26 radix
            tokens). A hypothesis still running after ``max_len`` steps is returned cut, with ``finished=False``;
            with ``radix``, a step where no whole word fits any more (only EOS would be legal) is not run, and the
            hypotheses still going end before it the same way (ACORT: 13 words in ``max_len`` 27).
        min_len: EOS is forbidden before this many tokens have been generated.
        beam_size: K, beams per image (``"beam"``).
        n_best: hypotheses returned per image by beam search (<= ``beam_size``).
        length_penalty: ``"none"`` (ACORT/ORT default: plain sum of log-probs), ``"wu"`` (GNMT,
            Wu et al. 2016 Eq. 14: ``((5 + L) / 6) ** alpha``) or ``"avg"`` (``L ** alpha``); ranks finished beams.
        length_penalty_alpha: the exponent alpha of the length penalty.
        num_samples: samples per image (``"sample"``; SCST uses 5–15).
        temperature: sampling temperature (> 0).
        top_k: sample only among the k most likely tokens (0 = all).
        seed: seed of the sampling generator (a ``numpy.random.Generator``); None draws fresh OS entropy.
        no_repeat_ngram: forbid repeating any n-gram of this size (0 = off).
        forbid_tokens: extra token ids never generated (e.g. a word vocab's ``<unk>``).
        pad_id, bos_id, eos_id: special token ids, from the vocabulary.
        radix: radix layout to enforce during search (None for word vocabularies).
        prune_finished: drop finished images (beam) or rows (greedy/sample) from the batch, a real speed-up for
            batches; False keeps every step at the full batch, which fixed-shape graphs prefer.
        length_level: 1-based length level (LaBERT §3.1) for length-controllable models; required by
            ``"mask_predict"``, fed to a length-aware autoregressive model's encoder otherwise (None = no control).
        refine_steps: mask-predict steps T (None: the model's per-level default, §4.4).
        eos_decay: mask-predict EOS decay γ (None: the model's per-level default, §4.2, Eq. 5).
        update_rule: mask-predict confidence update: ``"global"`` (LaBERT Eq. 7) or ``"original"`` (mask-predict).
    """

    strategy: str = "beam"
    max_len: int = 20
    min_len: int = 0
    beam_size: int = 3
    n_best: int = 1
    length_penalty: str = "none"
    length_penalty_alpha: float = 0.0
    num_samples: int = 1
    temperature: float = 1.0
    top_k: int = 0
    seed: int | None = None
    no_repeat_ngram: int = 0
    forbid_tokens: tuple[int, ...] = ()
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    radix: RadixSpec | None = None
    prune_finished: bool = True
    length_level: int | None = None
    refine_steps: int | None = None
    eos_decay: float | None = None
    update_rule: str = "global"

    def __post_init__(self) -> None:
        if self.length_level is not None and (isinstance(self.length_level, bool) or self.length_level < 1):
            raise DecodeCfgError(f"length_level must be a 1-based level (>= 1), got {self.length_level!r}")
        if self.refine_steps is not None and self.refine_steps < 1:
            raise DecodeCfgError(f"refine_steps must be >= 1, got {self.refine_steps}")
        if self.eos_decay is not None and not 0.0 < self.eos_decay <= 1.0:
            raise DecodeCfgError(f"eos_decay must be in (0, 1], got {self.eos_decay}")
        if self.update_rule not in UPDATE_RULES:
            raise DecodeCfgError(f"update_rule must be one of {UPDATE_RULES}, got {self.update_rule!r}")
        if self.strategy not in STRATEGIES:
            raise DecodeCfgError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.length_penalty not in LENGTH_PENALTIES:
            raise DecodeCfgError(f"length_penalty must be one of {LENGTH_PENALTIES}, got {self.length_penalty!r}")
        for name in ("max_len", "beam_size", "n_best", "num_samples"):
            if getattr(self, name) < 1:
                raise DecodeCfgError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.beam_size > MAX_BEAM:
            raise DecodeCfgError(f"beam_size must be <= MAX_BEAM ({MAX_BEAM}), got {self.beam_size}")
        for name in ("min_len", "top_k", "no_repeat_ngram"):
            if getattr(self, name) < 0:
                raise DecodeCfgError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.min_len >= self.max_len:
            raise DecodeCfgError(f"min_len ({self.min_len}) must be smaller than max_len ({self.max_len})")
        if self.n_best > self.beam_size:
            raise DecodeCfgError(f"n_best ({self.n_best}) cannot exceed beam_size ({self.beam_size})")
        if not self.temperature > 0:
            raise DecodeCfgError(f"temperature must be > 0, got {self.temperature}")
        ids = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        if any(v < 0 for v in ids.values()) or len(set(ids.values())) != 3:
            raise DecodeCfgError(f"pad_id, bos_id and eos_id must be distinct and >= 0, got {ids}")
        if self.eos_id in self.forbid_tokens:
            raise DecodeCfgError(f"forbid_tokens contains eos_id {self.eos_id}; use min_len to delay EOS instead")
        if isinstance(self.forbid_tokens, list):  # accept lists from YAML/JSON, keep the dataclass hashable
            object.__setattr__(self, "forbid_tokens", tuple(self.forbid_tokens))
        if isinstance(self.radix, Mapping):
            object.__setattr__(self, "radix", RadixSpec(**self.radix))
        if self.radix is not None:
            expected = {"pad_id": 0, "bos_id": self.radix.base + 1, "eos_id": self.radix.base + 2}
            if ids != expected:
                raise DecodeCfgError(f"radix base {self.radix.base} implies token ids {expected}, got {ids}")

    @classmethod
    def for_vocab(
        cls, vocab: Any, *, constrain_radix: bool = True, suppress_unk: bool = False, **overrides: Any
    ) -> DecodeCfg:
        """A config whose token ids (and radix layout) come from ``vocab``.

        Args:
            vocab: an ``edgecap.runtime.vocab`` vocabulary (duck-typed: ``pad_id``/``bos_id``/``eos_id``, and for radix
                vocabularies ``base``/``digits``/``num_words``).
            constrain_radix: mask illegal digit sequences during search (radix vocabularies only).
            suppress_unk: never generate ``<unk>`` (word: forbid ``unk_id``; radix: bound word indices below N−1).
            **overrides: any other :class:`DecodeCfg` field.
        """
        fields = {"pad_id": vocab.pad_id, "bos_id": vocab.bos_id, "eos_id": vocab.eos_id}
        forbid = tuple(overrides.pop("forbid_tokens", ()))
        if getattr(vocab, "kind", None) == "radix" or hasattr(vocab, "digits"):
            if constrain_radix:
                fields["radix"] = RadixSpec(vocab.base, vocab.digits, vocab.num_words, allow_unk=not suppress_unk)
        elif suppress_unk and getattr(vocab, "unk_id", None) is not None:
            forbid = (*forbid, vocab.unk_id)
        return cls(**{**fields, "forbid_tokens": forbid, **overrides})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecodeCfg:
        """Build from a plain mapping (YAML/JSON), rejecting unknown keys by name."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DecodeCfgError(f"unknown decoding option(s) {unknown}; known: {sorted(known)}")
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict that :meth:`from_dict` reads back."""
        out = dataclasses.asdict(self)
        out["forbid_tokens"] = list(self.forbid_tokens)
        return out

    def replace(self, **changes: Any) -> DecodeCfg:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
