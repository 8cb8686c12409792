"""Model registry (timm-style): one ``@register_model`` function per named variant, one builder per family.

A variant function takes no arguments and returns its architecture cfg (a frozen dataclass); the cfg's ``family``
names the builder that turns ``(cfg, vocab_size)`` into a :class:`~edgecap.workshop.models.base.CaptionModel`. Adding a
variant is one decorated function; adding a family is one module that calls :func:`register_family` and is imported
by ``edgecap/workshop/models/__init__.py``. Nothing here branches on a model name.

What differs between families beyond building the network lives in the family's :class:`FamilyHooks`: how it is
trained (its objective), how it decodes (beam search or mask-predict, and its torch adapter) and how it is exported
(its export spec). Code elsewhere asks :func:`family_hooks` and never checks a family's name or a model's methods.

A family cfg provides (see :class:`FamilyCfg`): ``family``, ``feature_dim``, ``vocab_kind``, ``radix_base``,
``output_classes(vocab_size)``, ``to_dict()``, ``from_dict(data, source)`` and ``summary()``.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, overload

import torch
from torch import nn

from edgecap.runtime.backends.roles import DECODING_ROLES
from edgecap.workshop.models._cfg import PAPER_FEATURE_DIM, PAPER_WORD_VOCAB_SIZE, ModelCfgError
from edgecap.workshop.models.base import CaptionModel

__all__ = [
    "EDGE_WORD_VOCAB_SIZE",
    "FamilyCfg",
    "FamilyHooks",
    "UnknownModelError",
    "cfg_from_dict",
    "count_model_parameters",
    "count_parameters",
    "create_model",
    "create_model_from_cfg",
    "describe_models",
    "edge_settings",
    "family_hooks",
    "get_model_cfg",
    "list_families",
    "list_models",
    "model_family",
    "paper_params",
    "paper_settings",
    "register_family",
    "register_model",
]

#: A typical word vocabulary of the synthetic/edge datasets: 120 words + PAD, BOS, EOS, UNK.
EDGE_WORD_VOCAB_SIZE = 124


class UnknownModelError(ValueError):
    """A model or family name that is not registered."""


class FamilyCfg(Protocol):
    """What the registry needs from a family's cfg dataclass."""

    family: str
    feature_dim: int
    vocab_kind: str
    radix_base: int

    def output_classes(self, vocab_size: int) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...

    def summary(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class _Variant:
    name: str
    fn: Callable[[], Any]
    paper_params: float | None


@dataclass(frozen=True)
class FamilyHooks:
    """A family's behaviour, named as ``"package.module:attr"`` strings so registering a family imports neither the
    training code nor the exporter.

    Attributes:
        decoding: a kind of :data:`~edgecap.runtime.backends.roles.DECODING_ROLES`, as its export spec declares it:
            ``"autoregressive"`` (beam or greedy search over a step model) or ``"mask_predict"`` (LaBERT §3.2).
        objective: the training objective, ``(model, visual, tokens, pad_id, cfg, tokens_per_word) -> (loss, nll)``.
        torch_decoder: the torch adapter decoding drives, constructed as ``cls(model, device=device)``.
        export_spec: ``builder(model, *, backbone=None, name=None, **options) -> ExportSpec``; None = not exportable.
        static_step: its decoder runs with static-shape caches written in place
        (``edgecap.workshop.torch_runtime.static_cache``),
            so the torch runtime offers ``step_mode="static"``, ``"cuda-graph"`` and ``"compile"`` for it.
    """

    decoding: str = "autoregressive"
    objective: str = "edgecap.workshop.training.objectives:cross_entropy"
    torch_decoder: str = "edgecap.workshop.torch_runtime.runtime:TorchStepModel"
    export_spec: str | None = None
    static_step: bool = False

    def __post_init__(self) -> None:
        if self.decoding not in DECODING_ROLES:
            raise ValueError(f"FamilyHooks.decoding must be one of {list(DECODING_ROLES)}, got {self.decoding!r}")
        for label in ("objective", "torch_decoder", "export_spec"):
            target = getattr(self, label)
            if target is not None and (not isinstance(target, str) or target.count(":") != 1 or target[0] == ":"):
                raise ValueError(f"FamilyHooks.{label} must look like 'package.module:attr', got {target!r}")

    def resolve(self, hook: str) -> Any:
        """Import and return the object the ``hook`` field names (``"objective"``, ``"torch_decoder"``, …)."""
        target = getattr(self, hook)
        if target is None:
            raise UnknownModelError(f"this model family has no {hook} hook")
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class _Family:
    cfg_cls: type[Any]
    builder: Callable[[Any, int], CaptionModel]
    hooks: FamilyHooks


_VARIANTS: dict[str, _Variant] = {}
_FAMILIES: dict[str, _Family] = {}

F = TypeVar("F", bound=Callable[[], Any])


@overload
def register_model(fn: F, /) -> F: ...


@overload
def register_model(*, name: str | None = None, paper_params: float | None = None) -> Callable[[F], F]: ...


def register_model(
    fn: F | None = None, *, name: str | None = None, paper_params: float | None = None
) -> F | Callable[[F], F]:
    """Register a variant; usable bare (``@register_model``) or with options (``@register_model(paper_params=...)``).

    Args:
        fn: a no-argument function returning the variant's cfg.
        name: registry name; defaults to the function name with ``_`` -> ``-`` (``acort_base_al`` -> ``acort-base-al``).
        paper_params: the parameter count the paper reports for this variant (shown by ``edgecap zoo``).
    """

    def wrap(f: F) -> F:
        key = name or f.__name__.replace("_", "-")
        if key in _VARIANTS and _VARIANTS[key].fn is not f:
            raise ValueError(f"model {key!r} is already registered (by {_VARIANTS[key].fn.__module__})")
        _VARIANTS[key] = _Variant(key, f, paper_params)
        return f

    return wrap(fn) if fn is not None else wrap


def register_family(
    family: str,
    cfg_cls: type[Any],
    builder: Callable[[Any, int], CaptionModel],
    hooks: FamilyHooks | None = None,
) -> None:
    """Register how cfgs of ``family`` are loaded (``cfg_cls.from_dict``) and built (``builder(cfg, vocab_size)``),
    and how its models train, decode and export (``hooks``; default: cross-entropy, autoregressive search, no export
    spec)."""
    if hooks is not None and not isinstance(hooks, FamilyHooks):
        raise TypeError(f"register_family: hooks must be a FamilyHooks, got {type(hooks).__name__}")
    _FAMILIES[family] = _Family(cfg_cls, builder, hooks or FamilyHooks())


def family_hooks(family_or_model: Any) -> FamilyHooks:
    """The :class:`FamilyHooks` of a family name, or of a model (its ``cfg.family``)."""
    family = family_or_model
    if not isinstance(family_or_model, str):
        family = getattr(getattr(family_or_model, "cfg", None), "family", None)
        if family is None:
            raise UnknownModelError(f"{type(family_or_model).__name__} has no cfg.family; cannot find its family")
    return _family(family).hooks


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching the fnmatch ``pattern`` (e.g. ``"acort-*"``, ``"*-test*"``), sorted."""
    return sorted(n for n in _VARIANTS if fnmatch.fnmatchcase(n, pattern))


def list_families() -> list[str]:
    """Registered family names, sorted."""
    return sorted(_FAMILIES)


def _variant(name: str) -> _Variant:
    try:
        return _VARIANTS[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_VARIANTS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownModelError(f"unknown model {name!r}{hint} (see `edgecap zoo` for all {len(_VARIANTS)})") from None


def _family(family: str) -> _Family:
    try:
        return _FAMILIES[family]
    except KeyError:
        raise UnknownModelError(f"unknown model family {family!r}; registered: {list_families()}") from None


def get_model_cfg(name: str) -> Any:
    """The registered cfg of ``name`` (a fresh frozen dataclass)."""
    return _variant(name).fn()


def model_family(name: str) -> str:
    return get_model_cfg(name).family


def paper_params(name: str) -> float | None:
    """The parameter count reported by the paper for ``name`` (e.g. ACORT Table 1), or None."""
    return _variant(name).paper_params


def _apply_overrides(cfg: Any, overrides: Mapping[str, Any]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ModelCfgError(f"unknown override(s) {unknown} for a {cfg.family!r} model; fields: {sorted(fields)}")
    # None means "not given" (style guide), except for fields where None is a real value (e.g. share_att=None).
    changes = {k: v for k, v in overrides.items() if v is not None or "None" in str(fields[k].type)}
    return dataclasses.replace(cfg, **changes) if changes else cfg


def create_model(name: str, vocab_size: int, feature_dim: int | None = None, **overrides: Any) -> CaptionModel:
    """Build the registered model ``name`` with ``vocab_size`` output classes.

    Args:
        name: a registered name (``list_models()``).
        vocab_size: number of output classes (``Vocabulary.size``); radix models need ``radix_base + 3``.
        feature_dim: channels of the visual features; None keeps the cfg's (1280, EfficientNet-Lite0).
        **overrides: cfg fields to change (``dropout=0.0``, ``enc_layer_map="(0x2)"``, ``share_att=None``, ...).

    Raises:
        UnknownModelError: ``name`` is not registered.
        ModelCfgError: an unknown override, an invalid value, or a vocab size the cfg cannot have.
    """
    cfg = get_model_cfg(name)
    if feature_dim is not None:
        overrides = {**overrides, "feature_dim": feature_dim}
    return create_model_from_cfg(_apply_overrides(cfg, overrides), vocab_size)


def create_model_from_cfg(cfg: Any, vocab_size: int) -> CaptionModel:
    """Build a model from a cfg object (e.g. one read back with :func:`cfg_from_dict`)."""
    family = _family(cfg.family)
    return family.builder(cfg, cfg.output_classes(vocab_size))


def cfg_from_dict(data: Mapping[str, Any], source: str = "model config") -> Any:
    """Inverse of ``cfg.to_dict()`` for any registered family (dispatches on ``data["family"]``)."""
    if not isinstance(data, Mapping) or "family" not in data:
        raise ModelCfgError(f"{source}: a model config needs a 'family' field")
    return _family(data["family"]).cfg_cls.from_dict(data, source=source)


def count_parameters(model: nn.Module) -> int:
    """Number of parameters, each shared tensor counted once (``Module.parameters()`` de-duplicates), as the
    ACORT reference counts them (``model_params.json``)."""
    return sum(p.numel() for p in model.parameters())


def count_model_parameters(name: str, vocab_size: int, feature_dim: int | None = None, **overrides: Any) -> int:
    """Parameter count of ``create_model(name, vocab_size, feature_dim, **overrides)``, built on the ``meta``
    device so that no memory is allocated (a 55 M model costs milliseconds)."""
    with torch.device("meta"):
        model = create_model(name, vocab_size, feature_dim, **overrides)
    return count_parameters(model)


def paper_settings(name: str) -> dict[str, int]:
    """``create_model`` arguments at the paper's setting: 2,048-d bottom-up region features (or the cfg's
    ``paper_feature_dim``) and the COCO vocabulary (10,001 SentencePiece word ids, or ``radix_base + 3`` radix
    classes) — Table 1's counts."""
    cfg = get_model_cfg(name)
    # A family whose paper uses another word vocabulary (Image Transformer: 10,369 + 1) says so in its cfg.
    vocab = cfg.radix_base + 3 if cfg.vocab_kind == "radix" else getattr(cfg, "paper_vocab_size", PAPER_WORD_VOCAB_SIZE)
    # A family whose paper uses other features (ExpansionNet v2: a Swin-L grid) says so in its cfg.
    return {"vocab_size": vocab, "feature_dim": getattr(cfg, "paper_feature_dim", PAPER_FEATURE_DIM)}


def edge_settings(name: str, vocab_size: int = EDGE_WORD_VOCAB_SIZE, feature_dim: int | None = None) -> dict[str, int]:
    """``create_model`` arguments at edgecap's default setting: the cfg's feature dim (EfficientNet-Lite0 grid,
    1280) and a small word vocabulary of ``vocab_size`` classes; radix models keep ``radix_base + 3``."""
    cfg = get_model_cfg(name)
    vocab = cfg.radix_base + 3 if cfg.vocab_kind == "radix" else vocab_size
    return {"vocab_size": vocab, "feature_dim": cfg.feature_dim if feature_dim is None else feature_dim}


def describe_models(
    pattern: str = "*", edge_vocab_size: int = EDGE_WORD_VOCAB_SIZE, edge_feature_dim: int | None = None
) -> list[dict[str, Any]]:
    """One row per registered model: architecture summary, parameters at paper and at edge settings, and the
    paper's reported count. This is what ``edgecap zoo`` prints."""
    rows = []
    for name in list_models(pattern):
        paper = paper_settings(name)
        edge = edge_settings(name, edge_vocab_size, edge_feature_dim)
        rows.append(
            {
                "name": name,
                **get_model_cfg(name).summary(),
                "params_paper": count_model_parameters(name, **paper),
                "paper_reported": paper_params(name),
                "params_edge": count_model_parameters(name, **edge),
                "paper_settings": paper,
                "edge_settings": edge,
            }
        )
    return rows
