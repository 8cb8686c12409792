"""The torch backend: ``TorchStepModel`` (a CaptionModel as a StepModel) and ``TorchRuntime`` (one nn.Module graph).

Both run on CPU or CUDA by device string. State tensors stay on the device: beam reordering is ``index_select`` on
the device, never a host copy of the state. ``TorchStepModel`` owns the conversions of the numpy search's contract
(``docs/contracts.md``, "StepModel"): numpy or torch inputs in, numpy tokens and row indices moved to the device,
log-probs returned as numpy float32 (one device-to-host copy per step on CUDA, none on CPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from edgecap.runtime.backends.base import Array, Runtime, TensorMeta
from edgecap.runtime.decoding.protocol import DecodeInputError, State

CAPTION_INPUTS = ("features", "boxes", "feature_mask")
#: Optional encoder input of length-controllable models (LaBERT §3.1), (B,) int64, 1-based.
LENGTH_LEVEL_INPUT = "length_level"


def resolve_device(device: str | torch.device) -> torch.device:
    """``torch.device(device)``; ``"auto"`` means CUDA when available. Clear error when CUDA is asked for but absent."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(dev)!r} requested but torch.cuda.is_available() is False")
    return dev


class TorchStepModel:
    """:class:`~edgecap.runtime.decoding.StepModel` over a ``CaptionModel`` (``docs/contracts.md``, "models").

    The model is moved to ``device`` (and cast to ``dtype`` when given) and put in eval mode; every call runs under
    ``torch.inference_mode()``.

    Args:
        model: implements ``encode(features, boxes, feature_mask) -> state`` and ``step(tokens, state)``.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, …
        dtype: cast weights and floating inputs to this dtype (e.g. ``torch.float16`` on CUDA).
        autocast: run under ``torch.autocast`` with this dtype instead (mixed precision, fp32 weights).
        step_mode: ``"eager"`` (the model's own step, growing caches), ``"static"`` (static-shape caches written in
            place), ``"cuda-graph"`` (the static step captured once per batch shape and replayed), ``"compile"``
            (the static step through ``torch.compile``) or ``"auto"`` (``cuda-graph`` on CUDA where the model has a
            static step, else ``eager``); see :mod:`edgecap.workshop.torch_runtime.static_cache`.
    """

    def __init__(
        self,
        model: nn.Module,
        device: str | torch.device = "cpu",
        *,
        dtype: torch.dtype | None = None,
        autocast: torch.dtype | None = None,
        step_mode: str = "eager",
    ) -> None:
        from edgecap.workshop.torch_runtime.static_cache import StaticStepModel, resolve_step_mode

        if dtype is not None and autocast is not None:
            raise ValueError("pass either dtype (cast the model) or autocast (mixed precision), not both")
        self.device = resolve_device(device)
        self.dtype, self.autocast_dtype = dtype, autocast
        self.step_mode = resolve_step_mode(step_mode, self.device, model)
        self.model = model.to(self.device) if dtype is None else model.to(self.device, dtype)
        self.model.eval()
        self._static = None
        if self.step_mode != "eager":
            self._static = StaticStepModel(self.model, self.device, self.step_mode, self._capture_context)

    @contextlib.contextmanager
    def _context(self) -> Iterator[None]:
        with torch.inference_mode():
            if self.autocast_dtype is None:
                yield
            else:
                with torch.autocast(self.device.type, dtype=self.autocast_dtype):
                    yield

    @contextlib.contextmanager
    def _capture_context(self) -> Iterator[None]:
        """:meth:`_context` without autocast's weight-cast cache, which a CUDA graph capture must not use (the
        cached casts would be freed after capture while the graph still reads them)."""
        with torch.inference_mode():
            if self.autocast_dtype is None:
                yield
            else:
                with torch.autocast(self.device.type, dtype=self.autocast_dtype, cache_enabled=False):
                    yield

    def _prepare(self, value: Any) -> Tensor:
        tensor = as_torch(value)
        if self.dtype is not None and tensor.is_floating_point():
            return tensor.to(self.device, self.dtype, non_blocking=True)
        return tensor.to(self.device, non_blocking=True)

    def _caption_inputs(self, inputs: Mapping[str, Any]) -> tuple[Tensor, Tensor, Tensor | None]:
        """``features``, ``boxes`` and the optional ``feature_mask`` on the device, with a clear error otherwise."""
        missing = [n for n in CAPTION_INPUTS[:2] if n not in inputs]
        unknown = [n for n in inputs if n not in (*CAPTION_INPUTS, LENGTH_LEVEL_INPUT)]
        if missing or unknown:
            raise DecodeInputError(
                f"{type(self).__name__}.encode: inputs need {list(CAPTION_INPUTS[:2])} (+ optional 'feature_mask'); "
                f"missing {missing}, unknown {unknown}"
            )
        mask = inputs.get("feature_mask")
        return (
            self._prepare(inputs["features"]),
            self._prepare(inputs["boxes"]),
            (None if mask is None else self._prepare(mask)),
        )

    def encode(self, inputs: Mapping[str, Any]) -> State:
        """inputs: ``features`` (B, N, C), ``boxes`` (B, N, 4), optional ``feature_mask`` (B, N) bool; numpy arrays
        or torch tensors. Returns the model's state, torch tensors on the device."""
        features, boxes, mask = self._caption_inputs(inputs)
        level = inputs.get(LENGTH_LEVEL_INPUT)
        extra = {} if level is None else {"length_level": self._prepare(level).long()}
        with self._context():
            state = self.model.encode(features, boxes, mask, **extra)
        if not isinstance(state, Mapping):
            raise DecodeInputError(f"{type(self.model).__name__}.encode must return a dict of tensors")
        if self._static is not None:
            with torch.inference_mode():
                return self._static.encode_state(dict(state))
        return dict(state)

    def _index(self, index: Any) -> Tensor:
        """The search's int64 numpy tokens / row indices as a long tensor on the device."""
        return as_torch(index).to(self.device, torch.long, non_blocking=True)

    def step(self, tokens: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        """tokens: (B,) int64 numpy (torch accepted). Returns (B, V) float32 numpy log-probs and the torch state."""
        if self._static is not None:
            with torch.inference_mode():
                return self._static.step(np.asarray(as_torch(tokens).cpu()), state)
        with self._context():
            logprobs, new_state = self.model.step(self._index(tokens), state)
        return host_float32(logprobs), dict(new_state)

    def select(self, state: State, index: np.ndarray) -> State:
        if self._static is not None:
            with torch.inference_mode():
                return self._static.select(state, np.asarray(as_torch(index).cpu()))
        with torch.inference_mode():
            rows = self._index(index)
            return {name: value.index_select(0, rows) for name, value in state.items()}


def as_torch(value: Any) -> Tensor:
    """A torch tensor of ``value``: tensors as they are, numpy arrays zero-copy (copied only when read-only)."""
    if isinstance(value, Tensor):
        return value
    array = np.asarray(value)
    if not array.flags.writeable:
        array = array.copy()  # torch.from_numpy warns on read-only memory
    return torch.from_numpy(array)


def host_float32(logprobs: Tensor) -> np.ndarray:
    """Log-probs as the search reads them: float32 numpy on the host (zero-copy for a CPU float32 tensor)."""
    return logprobs.detach().float().cpu().numpy()


MetaSpec = TensorMeta | tuple[Any, Sequence[int | str | None]]


class TorchRuntime(Runtime):
    """One ``nn.Module`` graph as a :class:`Runtime` (the benchmark's torch baseline, and parity reference).

    ``module`` is called positionally with the inputs in declared order; it may return a tensor, a tuple/list (matched
    to ``output_names`` in order) or a dict (looked up by name). Nothing moves to ``device`` before activation;
    closing moves the module back to where it was.

    Args:
        module: the graph.
        inputs: input name → :class:`TensorMeta` or ``(dtype, shape)``; ``None``/string dims are dynamic.
        output_names: names of the outputs.
        device: torch device string.
        dtype: cast the module's weights to this dtype on activation.
        name: for messages.
    """

    array_type = "torch"

    def __init__(
        self,
        module: nn.Module,
        inputs: Mapping[str, MetaSpec],
        output_names: Sequence[str],
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name or f"TorchRuntime({type(module).__name__})")
        self.module = module
        self._inputs = {
            n: m if isinstance(m, TensorMeta) else TensorMeta.of(n, m[0], m[1]) for n, m in dict(inputs).items()
        }
        self.output_names = tuple(output_names)
        if not self.output_names:
            raise ValueError(f"{self.name}: output_names is empty")
        self.device = torch.device(device)
        self.dtype = dtype
        self._home: torch.device | None = None

    def _activate(self) -> None:
        self.device = resolve_device(self.device)
        first = next(self.module.parameters(), None)
        self._home = first.device if first is not None else None
        if self.dtype is None:
            self.module.to(self.device)
        else:
            self.module.to(self.device, self.dtype)
        self.module.eval()

    def _input_metadata(self) -> Mapping[str, TensorMeta]:
        return self._inputs

    def _infer(self, feed: Mapping[str, Array]) -> dict[str, Array]:
        with torch.inference_mode():
            args = [_to_device(feed[n], self.device) for n in self._inputs]
            out = self.module(*args)
            if isinstance(out, Tensor):
                out = (out,)
            if isinstance(out, Mapping):
                absent = [n for n in self.output_names if n not in out]
                if absent:
                    raise ValueError(f"{self.name}: module outputs lack {absent} (got {sorted(out)})")
                result = {n: out[n] for n in self.output_names}
            else:
                if len(out) != len(self.output_names):
                    raise ValueError(
                        f"{self.name}: module returned {len(out)} outputs, output_names has {len(self.output_names)}"
                    )
                result = dict(zip(self.output_names, out, strict=True))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # latency must cover the kernels, not just their launch
        return result

    def _close(self) -> None:
        if self._home is not None and self._home != self.device:
            self.module.to(self._home)


def _to_device(value: Array, device: torch.device) -> Tensor:
    tensor = value if isinstance(value, Tensor) else torch.as_tensor(value)
    return tensor.to(device, non_blocking=True)


# -- bundles on torch (the registry's loaders for "torch" and "torch-rerun") ------------------------------------------
