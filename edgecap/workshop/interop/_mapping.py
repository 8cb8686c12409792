"""Bookkeeping shared by the importers: take official tensors by name, find shared layers, load strictly.

Every importer reads the official state dict through :class:`OfficialState`, which records what was consumed, so
that a tensor the mapping does not know about is an error naming it instead of being silently dropped, and loads
the converted dict with :func:`load_converted`, which names every missing, unexpected or mis-shaped tensor.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from edgecap.workshop.interop._reading import CheckpointError
from edgecap.workshop.models.state_check import state_mismatch

__all__ = ["OfficialState", "layer_positions", "load_converted", "shared_layer_map"]

_SHOW = 8


def _names(keys: Iterable[str]) -> str:
    keys = sorted(keys)
    more = f" … (+{len(keys) - _SHOW} more)" if len(keys) > _SHOW else ""
    return ", ".join(repr(k) for k in keys[:_SHOW]) + more


class OfficialState:
    """An official state dict whose tensors are taken by name; :meth:`finish` fails on anything left over."""

    def __init__(self, state: Mapping[str, torch.Tensor], source: str) -> None:
        self._state = dict(state)
        self._used: set[str] = set()
        self.source = source

    def __contains__(self, key: str) -> bool:
        return key in self._state

    def names(self) -> list[str]:
        return list(self._state)

    def peek(self, key: str, ndim: int | None = None) -> torch.Tensor:
        """The tensor ``key`` without consuming it; with ``ndim``, its number of dimensions is checked first, so that a
        flattened tensor is refused under its own name rather than where its shape is first used."""
        if key not in self._state:
            raise CheckpointError(f"{self.source}: missing tensor {key!r} (is this a checkpoint of the right model?)")
        tensor = self._state[key]
        if ndim is not None and tensor.dim() != ndim:
            raise CheckpointError(
                f"{self.source}: tensor {key!r} has shape {tuple(tensor.shape)} ({tensor.dim()}-d), expected {ndim}-d "
                "(flattened or reshaped?)"
            )
        if not tensor.is_floating_point():
            raise CheckpointError(
                f"{self.source}: tensor {key!r} is {tensor.dtype}; the weights of this model are floating point "
                "(a quantized or damaged export?)"
            )
        return tensor

    def take(self, key: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """Consume ``key``; with ``shape``, check it (the message names the tensor and both shapes)."""
        tensor = self.peek(key)
        if shape is not None and tuple(tensor.shape) != tuple(shape):
            raise CheckpointError(
                f"{self.source}: tensor {key!r} has shape {tuple(tensor.shape)}, expected {tuple(shape)}"
            )
        self._used.add(key)
        return tensor

    def take_prefix(self, prefix: str) -> dict[str, torch.Tensor]:
        """Consume every tensor under ``prefix`` and return them keyed by the rest of their name."""
        out = {k[len(prefix) :]: v for k, v in self._state.items() if k.startswith(prefix)}
        self._used.update(prefix + k for k in out)
        return out

    def discard(self, keys: Iterable[str]) -> None:
        """Mark tensors as accounted for without using them (aliases already checked, derived buffers)."""
        for key in keys:
            if key not in self._state:
                self.peek(key)  # the missing-tensor error
            self._used.add(key)

    def finish(self) -> None:
        """Raise if any official tensor was not consumed (an unexpected tensor means an unsupported variant)."""
        left = set(self._state) - self._used
        if left:
            raise CheckpointError(
                f"{self.source}: {len(left)} unexpected tensor(s) the importer does not know: {_names(left)} "
                "(a model variant or option this importer does not support)"
            )


def layer_positions(state: OfficialState, prefix: str) -> int:
    """Number of layers stored as ``{prefix}{i}.…``; the indices must run 0 … n-1."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = {int(m.group(1)) for k in state.names() if (m := pattern.match(k))}
    if not found:
        raise CheckpointError(f"{state.source}: no layers found under {prefix!r}")
    if found != set(range(len(found))):
        raise CheckpointError(f"{state.source}: layers under {prefix!r} are numbered {sorted(found)}, not 0…n-1")
    return len(found)


def shared_layer_map(state: OfficialState, prefix: str) -> tuple[int, ...]:
    """The layer map of ``{prefix}{i}.…`` layers: positions holding identical tensors share one unique layer.

    The official ACORT code lists one module object at several positions of its ``ModuleList``; its ``state_dict``
    then repeats the same tensors under each position's name (aliases). Unique layers are numbered in order of first
    appearance, which is how ACORT writes ``(0x3,1x3)``.
    """
    count = layer_positions(state, prefix)
    layers = [{k[len(f"{prefix}{i}.") :]: state.peek(k) for k in state.names() if k.startswith(f"{prefix}{i}.")}
              for i in range(count)]  # fmt: skip
    representatives: list[int] = []
    mapping: list[int] = []
    for i, layer in enumerate(layers):
        for unique, rep in enumerate(representatives):
            if _same_layer(layers[rep], layer):
                mapping.append(unique)
                break
        else:
            representatives.append(i)
            mapping.append(len(representatives) - 1)
    return tuple(mapping)


def _same_layer(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    if a.keys() != b.keys():
        return False
    return all(a[k].shape == b[k].shape and (a[k] is b[k] or torch.equal(a[k], b[k])) for k in a)


def load_converted(model: nn.Module, converted: Mapping[str, torch.Tensor], source: str) -> None:
    """Load ``converted`` into ``model`` exactly: every parameter and persistent buffer, nothing else, same shapes.

    Raises:
        CheckpointError: naming missing, unexpected and mis-shaped tensors (edgecap names).
    """
    expected = model.state_dict()
    problems = state_mismatch(converted, expected, found_label="converted")
    if problems:
        raise CheckpointError(f"{source}: the converted weights do not fit the model: {problems}")
    integer = sorted(k for k, v in converted.items() if expected[k].is_floating_point() and not v.is_floating_point())
    if integer:  # a backstop: the importers check dtypes under the official names when they take the tensors
        raise CheckpointError(f"{source}: converted tensors {integer[:5]} are not floating point")
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in converted.items()}, strict=True)
