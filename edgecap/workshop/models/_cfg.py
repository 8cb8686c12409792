"""What every model family's config shares: the field checks, ``from_dict``/``replace`` helpers and the paper's
settings. Each family's config dataclass lives next to it (``_ort_cfg.py``, ``_expansionnet_cfg.py``,
``_labert_cfg.py``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from edgecap.runtime.length import LengthLevelError, Levels, parse_levels

__all__ = ["FamilyCfg", "ModelCfgError", "PAPER_FEATURE_DIM", "PAPER_WORD_VOCAB_SIZE", "VOCAB_KINDS"]

VOCAB_KINDS = ("word", "radix")
#: Bottom-up Faster R-CNN region features used by ORT/ACORT (ACORT §3).
PAPER_FEATURE_DIM = 2048
#: The reference's SentencePiece word vocabulary for COCO (pad/unk/bos/eos + 9,997 words).
PAPER_WORD_VOCAB_SIZE = 10001


_Cfg = TypeVar("_Cfg", bound="FamilyCfg")


def _lists(value: Any) -> Any:
    """Tuples (layer maps, level pairs, scales) as lists, recursively: what JSON holds and ``from_dict`` reads."""
    if isinstance(value, (tuple, list)):
        return [_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return value


class FamilyCfg:
    """What every family's config dataclass does the same way: copy with changes, JSON round trip, output classes.

    A family's config subclasses it (``@dataclass(frozen=True) class ExpansionNetCfg(FamilyCfg)``) and overrides only
    what differs (LaBERT's plan-dependent defaults in ``replace``, its word-only ``output_classes``).
    """

    def output_classes(self, vocab_size: int) -> int:
        """Validate ``vocab_size`` against this cfg and return it (radix models need ``radix_base + 3``)."""
        return radix_output_classes(self, vocab_size)

    def replace(self: _Cfg, **changes: Any) -> _Cfg:
        """A copy with ``changes``; unknown names raise :class:`ModelCfgError`."""
        return replace_cfg(self, changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples as lists); :meth:`from_dict` inverts it."""
        return _lists(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls: type[_Cfg], data: Mapping[str, Any], source: str = "model config") -> _Cfg:
        """Build from :meth:`to_dict` output (or a hand-written subset; missing fields take defaults).

        Raises:
            ModelCfgError: unknown fields or invalid values, naming ``source``.
        """
        return cfg_from_mapping(cls, data, source)


def cfg_from_mapping(cls: type[Any], data: Any, source: str) -> Any:
    """``cls(**data)`` for a family's config dataclass, with errors that name ``source`` (a run's ``config.json``, a
    bundle manifest): not a mapping, unknown fields, invalid values. Every family's ``from_dict`` uses it."""
    if not isinstance(data, Mapping):
        raise ModelCfgError(f"{source}: expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ModelCfgError(f"{source}: unknown model config field(s) {unknown}")
    try:
        return cls(**dict(data))
    except ModelCfgError as exc:
        raise ModelCfgError(f"{source}: {exc}") from exc


def replace_cfg(cfg: Any, changes: Mapping[str, Any]) -> Any:
    """``dataclasses.replace`` for a family's config dataclass; unknown field names raise :class:`ModelCfgError`
    listing the known ones. Every family's ``replace`` uses it."""
    names = [f.name for f in dataclasses.fields(cfg)]
    unknown = sorted(set(changes) - set(names))
    if unknown:
        raise ModelCfgError(f"unknown {type(cfg).__name__} field(s) {unknown}; known: {names}")
    return dataclasses.replace(cfg, **changes)


class ModelCfgError(ValueError):
    """A model configuration field with an invalid value or an unknown name."""


def check_positive_ints(cfg: Any, names: tuple[str, ...]) -> None:
    """Raise :class:`ModelCfgError` unless every field in ``names`` is an int >= 1 (bools refused)."""
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ModelCfgError(f"{type(cfg).__name__}.{name} must be a positive integer, got {value!r}")


def check_fractions(cfg: Any, names: tuple[str, ...]) -> None:
    """Raise :class:`ModelCfgError` unless every field in ``names`` is a number in [0, 1) (dropout rates)."""
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
            raise ModelCfgError(f"{type(cfg).__name__}.{name} must be in [0, 1), got {value!r}")


def radix_output_classes(cfg: Any, vocab_size: int) -> int:
    """``output_classes`` of a config with ``vocab_kind``/``radix_base``: validate ``vocab_size`` and return it
    (a radix model needs ``radix_base + 3`` classes)."""
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 2:
        raise ModelCfgError(f"vocab_size must be an integer >= 2, got {vocab_size!r}")
    if cfg.vocab_kind == "radix" and vocab_size != cfg.radix_base + 3:
        raise ModelCfgError(
            f"a radix model with radix_base={cfg.radix_base} has {cfg.radix_base + 3} classes "
            f"(PAD, {cfg.radix_base} digits, BOS, EOS) but vocab_size={vocab_size}; build the vocabulary with "
            f"radix_base={cfg.radix_base} or pass radix_base={vocab_size - 3}"
        )
    return vocab_size


def optional_length_levels(value: Any, owner: str) -> Levels | None:
    """A config's ``length_levels`` field, normalised: None (also the CLI spellings ``"none"``/``"null"``/``""``) ->
    None, a plan name or ``[[low, high], ...]`` -> validated pairs (:func:`~edgecap.runtime.length.parse_levels`).
    Every autoregressive family's config uses it, so ``--set length_levels=4level`` means the same everywhere.

    Raises:
        ModelCfgError: a malformed plan, naming ``owner`` (the config class).
    """
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
        return None
    try:
        return parse_levels(value)
    except LengthLevelError as exc:
        raise ModelCfgError(f"{owner}.length_levels: {exc}") from exc
