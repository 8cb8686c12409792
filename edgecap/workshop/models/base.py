"""``CaptionModel``: the deployable parts every autoregressive captioner exposes (docs/contracts.md, "models").

The base class owns the public methods and their input checks; a family fills in the ``_*_impl`` hooks.

- ``encode_memory(features, boxes, feature_mask) -> memory (B, N, d)``: the encoder graph;
- ``start(memory, feature_mask) -> state``: what every step reuses (cross-attention keys/values, the memory mask)
  plus an empty self-attention cache;
- ``step(tokens (B,), state) -> (log-probs (B, V), state)``: one token per hypothesis, cache grown by one;
- ``forward`` / ``decode_full``: teacher forcing over a whole prefix, computing exactly what repeated ``step`` does.

Every state tensor is batch-first, so beam reordering is ``index_select(0, idx)`` on each entry
(:meth:`CaptionModel.select_state`). Models are token-agnostic: BOS/EOS/PAD ids belong to the vocabulary.

Length control (LaBERT §3.1): a family whose model sets :attr:`CaptionModel.length_levels` takes a 1-based
``length_level`` (B,) in ``start``/``encode``/``decode_full``/``forward``; its hooks receive it as a keyword. The level
is constant per caption, so it rides in the decoder state and ``step`` is unchanged. Other families never see it.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, cast, overload

import torch
from torch import nn

from edgecap.runtime.length import LengthLevelError

__all__ = ["CaptionModel", "ModelInputError", "State"]

State = dict[str, torch.Tensor]


class ModelInputError(ValueError):
    """Inputs whose shape, dtype or state entries do not fit the model."""


def _differ(a: Any, b: Any) -> bool:
    # Compare sizes only when both are concrete ints: under torch.export they are symbolic, and a Python comparison
    # would add guards that specialise the exported graph.
    return isinstance(a, int) and isinstance(b, int) and a != b


class CaptionModel(nn.Module, abc.ABC):
    """Base of autoregressive captioners; see the module docstring for the contract.

    Attributes:
        cfg: the frozen architecture dataclass the model was built from (``cfg.to_dict()`` is JSON-ready).
        vocab_size: number of output classes ``V``.
        feature_dim: channels ``C`` of the visual features the encoder accepts.
    """

    #: ``((L_low, L_high), ...)`` when the model is length-controllable, else None.
    length_levels: tuple[tuple[int, int], ...] | None = None

    def __init__(self, cfg: Any, vocab_size: int, feature_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.feature_dim = feature_dim

    # -- what a family declares ------------------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def state_names(self) -> tuple[str, ...]:
        """Names of the state tensors in a fixed order (export flattens the state dict in this order)."""

    @property
    def image_state_names(self) -> tuple[str, ...]:
        """The states :meth:`step` also takes with one row per image: G rows for R = G·k hypotheses, image g's row
        serving its k consecutive hypotheses (its beams). Only states a step reads and never changes qualify (the
        cross-attention keys and the padding bias); a runtime then keeps one copy per image instead of one per beam
        and the step attends per image (:meth:`~edgecap.workshop.models.layers.MultiHeadAttention.cross_attend`).
        Default: none."""
        return ()

    @property
    def max_len(self) -> int:
        """Longest token sequence the decoder accepts (BOS + generated tokens)."""
        return int(self.cfg.max_len)

    @abc.abstractmethod
    def _encode_memory_impl(
        self, features: torch.Tensor, boxes: torch.Tensor, feature_mask: torch.Tensor | None
    ) -> torch.Tensor: ...

    @abc.abstractmethod
    def _start_impl(self, memory: torch.Tensor, feature_mask: torch.Tensor | None) -> State: ...

    @abc.abstractmethod
    def _step_impl(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]: ...

    @abc.abstractmethod
    def _decode_full_impl(
        self, memory: torch.Tensor, feature_mask: torch.Tensor | None, tokens: torch.Tensor
    ) -> torch.Tensor: ...

    # -- length control (LaBERT §3.1, Eq. 2) --------------------------------------------------------------------------
    def _init_length_control(self, levels: tuple[tuple[int, int], ...] | None, dim: int) -> None:
        """Make the model length-controllable when ``levels`` is a plan: a learned level embedding ``e_l`` (row 0
        unused, levels are 1-based) that the family adds to every token embedding. Call it where the family's
        ``__init__`` has always created it, so parameter order (and seeded initialisation) stays the same."""
        self.length_levels = levels
        self.level_embed = nn.Embedding(len(levels) + 1, dim) if levels else None

    @overload
    def _level(self, length_level: torch.Tensor) -> torch.Tensor: ...

    @overload
    def _level(self, length_level: None) -> None: ...

    def _level(self, length_level: torch.Tensor | None) -> torch.Tensor | None:
        """(B, 1, d) length-level embedding, or None for a model without length control."""
        # a length level reaches only a model built with levels (level_embed set)
        return None if length_level is None else cast(nn.Embedding, self.level_embed)(length_level)[:, None, :]

    def _with_level_state(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """``names`` plus ``level_embed`` (the caption's ``e_l``, set by ``start``, read by every step) for a
        length-controllable model."""
        return (*names, "level_embed") if self.length_levels else names

    # -- public API ------------------------------------------------------------------------------------------------
    def forward(
        self,
        features: torch.Tensor,
        boxes: torch.Tensor,
        feature_mask: torch.Tensor | None,
        tokens: torch.Tensor,
        length_level: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher forcing: ``tokens`` (B, T) (starting with BOS) -> log-probs (B, T, V) of each next token."""
        memory = self.encode_memory(features, boxes, feature_mask)
        return self.decode_full(memory, feature_mask, tokens, length_level)

    def encode_memory(
        self, features: torch.Tensor, boxes: torch.Tensor, feature_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``features`` (B, N, C), ``boxes`` (B, N, 4) normalised ``(x1, y1, x2, y2)``, ``feature_mask`` (B, N) bool
        (True = valid; None = all valid) -> memory (B, N, d)."""
        self._check_visual(features, boxes, feature_mask)
        return self._encode_memory_impl(features, boxes, feature_mask)

    def start(
        self, memory: torch.Tensor, feature_mask: torch.Tensor | None = None, length_level: torch.Tensor | None = None
    ) -> State:
        """Memory (B, N, d) -> the initial decoder state (see :attr:`state_names`), with an empty cache.

        ``length_level`` (B,) long, 1-based: required by a length-controllable model, refused by the others.
        """
        if memory.dim() != 3:
            raise ModelInputError(f"memory must be (B, N, d), got shape {tuple(memory.shape)}")
        self._check_mask(feature_mask, memory)
        return self._start_impl(memory, feature_mask, **self._level_kwargs(length_level, memory))

    def encode(
        self,
        features: torch.Tensor,
        boxes: torch.Tensor,
        feature_mask: torch.Tensor | None = None,
        length_level: torch.Tensor | None = None,
    ) -> State:
        """``start(encode_memory(...))``: everything :meth:`step` needs for these images."""
        return self.start(self.encode_memory(features, boxes, feature_mask), feature_mask, length_level)

    def step(self, tokens: torch.Tensor, state: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, State]:
        """One token per hypothesis: ``tokens`` (B,) -> (log-probs (B, V), new state with the cache grown by one).

        The new token's position is the current cache length. ``state`` is not modified.
        """
        if tokens.dim() != 1 or tokens.is_floating_point():
            raise ModelInputError(
                f"step tokens must be an integer tensor (B,), got {tokens.dtype} {tuple(tokens.shape)}"
            )
        missing = [n for n in self.state_names if n not in state]
        extra = sorted(set(state) - set(self.state_names))
        if missing or extra:
            raise ModelInputError(
                f"state does not match this model: missing {missing}, unexpected {extra}; expected {self.state_names}"
            )
        return self._step_impl(tokens, dict(state))

    def decode_full(
        self,
        memory: torch.Tensor,
        feature_mask: torch.Tensor | None,
        tokens: torch.Tensor,
        length_level: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher forcing on an already encoded memory: tokens (B, T), T >= 1 -> log-probs (B, T, V).

        Also the "re-run the whole prefix every step" decoder of the reference implementations: the log-probs of
        the next token are ``decode_full(memory, mask, prefix)[:, -1]``.
        """
        if tokens.dim() != 2 or tokens.is_floating_point():
            raise ModelInputError(f"tokens must be an integer tensor (B, T), got {tokens.dtype} {tuple(tokens.shape)}")
        if isinstance(tokens.shape[1], int) and tokens.shape[1] < 1:
            raise ModelInputError("tokens must hold at least one position (BOS)")
        if isinstance(tokens.shape[1], int) and tokens.shape[1] > self.max_len:
            raise ModelInputError(
                f"{tokens.shape[1]} tokens exceed the decoder's max_len={self.max_len}; "
                f"truncate captions or create the model with a larger max_len"
            )
        if _differ(tokens.shape[0], memory.shape[0]):
            raise ModelInputError(f"tokens have batch {tokens.shape[0]} but memory has batch {memory.shape[0]}")
        self._check_mask(feature_mask, memory)
        return self._decode_full_impl(memory, feature_mask, tokens, **self._level_kwargs(length_level, memory))

    @staticmethod
    def select_state(state: Mapping[str, torch.Tensor], index: torch.Tensor) -> State:
        """Reorder/expand hypotheses: ``index_select(0, index)`` on every (batch-first) state tensor."""
        return {name: value.index_select(0, index) for name, value in state.items()}

    # -- checks ----------------------------------------------------------------------------------------------------
    def _level_kwargs(self, length_level: torch.Tensor | None, memory: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{"length_level": ...}`` for a length-controllable model (checked), ``{}`` for the others."""
        levels = self.length_levels
        if not levels:
            if length_level is not None:
                raise LengthLevelError(
                    f"{type(self).__name__} ({getattr(self.cfg, 'family', '?')}) has no length control; use a "
                    f"length-aware variant (e.g. acort-xsmall-len) or --set length_levels=4level, then retrain"
                )
            return {}
        if length_level is None:
            raise LengthLevelError(f"this model is length-controllable: pass length_level in 1..{len(levels)}")
        if not isinstance(length_level, torch.Tensor) or length_level.dim() != 1 or length_level.is_floating_point():
            raise ModelInputError(f"length_level must be an integer tensor (B,), got {length_level!r}")
        if _differ(length_level.shape[0], memory.shape[0]):
            raise ModelInputError(f"length_level has batch {length_level.shape[0]}, memory {memory.shape[0]}")
        if not (torch.compiler.is_compiling() or torch.compiler.is_exporting()):
            bad = (length_level < 1) | (length_level > len(levels))
            if bool(bad.any()):
                ranges = ", ".join(f"{i + 1}: {lo}-{hi}" for i, (lo, hi) in enumerate(levels))
                raise LengthLevelError(
                    f"length_level must be in 1..{len(levels)} ({ranges} words), got {int(length_level[bad][0])}"
                )
        return {"length_level": length_level}

    def _check_visual(self, features: torch.Tensor, boxes: torch.Tensor, feature_mask: torch.Tensor | None) -> None:
        if features.dim() != 3 or not features.is_floating_point():
            raise ModelInputError(
                f"features must be a float tensor (B, N, C), got {features.dtype} {tuple(features.shape)}"
            )
        if _differ(features.shape[-1], self.feature_dim):
            raise ModelInputError(
                f"features have {features.shape[-1]} channels but the model expects feature_dim={self.feature_dim}"
            )
        if boxes.dim() != 3 or boxes.shape[-1] != 4 or not boxes.is_floating_point():
            raise ModelInputError(f"boxes must be a float tensor (B, N, 4), got {boxes.dtype} {tuple(boxes.shape)}")
        if _differ(boxes.shape[0], features.shape[0]) or _differ(boxes.shape[1], features.shape[1]):
            raise ModelInputError(f"boxes {tuple(boxes.shape)} do not match features {tuple(features.shape)} on (B, N)")
        self._check_mask(feature_mask, features)

    @staticmethod
    def _check_mask(feature_mask: torch.Tensor | None, like: torch.Tensor) -> None:
        if feature_mask is None:
            return
        if feature_mask.dtype != torch.bool or feature_mask.dim() != 2:
            raise ModelInputError(
                f"feature_mask must be a bool tensor (B, N) with True = valid, got "
                f"{feature_mask.dtype} {tuple(feature_mask.shape)}"
            )
        if _differ(feature_mask.shape[0], like.shape[0]) or _differ(feature_mask.shape[1], like.shape[1]):
            raise ModelInputError(
                f"feature_mask {tuple(feature_mask.shape)} does not match (B, N) = {tuple(like.shape[:2])}"
            )
