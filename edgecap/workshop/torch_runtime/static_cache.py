"""The static-shape decoder step: caches preallocated at ``max_len`` and written in place, so a step can be captured
once in a CUDA graph (or compiled) per batch shape and replayed for every token.

The eager torch step grows its self-attention cache with ``torch.cat`` (a new shape every step), which neither a
CUDA graph nor a shape-specialised compiled kernel can replay. Here every tensor a step touches has a fixed address
and shape for a given row *capacity*:

- ``self_k``/``self_v`` are (R, L, H, max_len, d_k) buffers; step ``t`` writes position ``t`` with ``index_copy_``
  at a device-side position counter and attends over all ``max_len`` positions with an additive bias that hides the
  positions after ``t`` (``MASK_VALUE``, whose ``exp`` is exactly 0, so the weights of the real positions are the
  eager ones up to the order of a floating-point sum);
- the other state entries (cross-attention keys, memory bias, length embedding) are copied once per decode into
  buffers of the same capacity;
- beam reordering is an in-place gather with a device index (``buf.copy_(buf.index_select(0, parent))``), itself a
  replayable graph; when the search prunes finished images the live rows are the first ``n`` of the capacity and
  the rest are ignored (padding rows repeat row 0), so pruning never changes a shape;
- per step the host sends the (R,) tokens and receives the (R, V) float32 log-probs (pinned buffers, one
  synchronisation), as the numpy search needs them (``docs/contracts.md``, "StepModel").

The same code runs on CPU (mode ``"static"``, no capture), which is how CI checks that it decodes exactly what the
eager step decodes. Workspaces (buffers and graphs) are memoised per thread and capacity: one decode at a time per
thread, any number of threads.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from edgecap.runtime.backends.registry import STEP_MODES
from edgecap.runtime.decoding.protocol import DecodeInputError, State
from edgecap.workshop.models.layers.attention import MASK_VALUE
from edgecap.workshop.models.layers.transformer import _unique_entry

#: Cache entries of the ORT/ACORT state that grow by one position per step (axis 3).
GROWING = ("self_k", "self_v")
#: Workspaces kept per thread (capacities); the least recently used beyond this are freed.
MAX_WORKSPACES = 12


class StepModeError(ValueError):
    """A step mode this model, device or torch build cannot run (the message says which mode can)."""


def static_step_supported(model: nn.Module) -> tuple[bool, str]:
    """(supported, why not): a family declares a static step with ``FamilyHooks(static_step=True)`` (today the
    ORT/ACORT family, whose decoder this module's layout is written against)."""
    from edgecap.workshop.models import UnknownModelError, family_hooks

    try:
        supported = family_hooks(model).static_step
    except UnknownModelError:  # a model of no registered family (a test double, a user's module): eager only
        supported = False
    if supported:
        return True, ""
    return (
        False,
        f"{type(model).__name__}'s family has no static-cache step (FamilyHooks.static_step); it decodes with "
        f"step_mode='eager'",
    )


def resolve_step_mode(mode: str, device: torch.device, model: nn.Module) -> str:
    """Check ``mode`` against the device and model; ``"auto"`` is ``"cuda-graph"`` on CUDA when the model supports
    the static step, else ``"eager"``.

    Raises:
        StepModeError: an unknown mode, a CUDA graph without CUDA, or a model without a static step.
    """
    supported, why = static_step_supported(model)
    if mode == "auto":
        return "cuda-graph" if device.type == "cuda" and supported else "eager"
    if mode not in STEP_MODES:
        raise StepModeError(f"step_mode must be 'auto' or one of {list(STEP_MODES)}, got {mode!r}")
    if mode == "eager":
        return mode
    if not supported:
        raise StepModeError(why)
    if mode == "cuda-graph" and device.type != "cuda":
        raise StepModeError(
            f"step_mode='cuda-graph' needs a CUDA device, got {str(device)!r}; step_mode='static' runs the same "
            f"static-shape step without capture"
        )
    if mode == "compile" and not hasattr(torch, "compile"):
        raise StepModeError(f"step_mode='compile' needs torch.compile (torch >= 2.0), not torch {torch.__version__}")
    return mode


@dataclass(frozen=True)
class StaticLayout:
    """Shapes and dtypes of a workspace: one buffer per state entry, rows = ``capacity``.

    Attributes:
        capacity: rows the buffers hold (the largest batch of the decode phase they serve).
        entries: name -> (shape, dtype) of each buffer; growing caches span ``max_len`` positions on axis 3.
        max_len: decoder positions.
    """

    capacity: int
    entries: tuple[tuple[str, tuple[int, ...], torch.dtype], ...]
    max_len: int

    @property
    def key(self) -> tuple:
        return (self.capacity, self.entries, self.max_len)

    def nbytes(self) -> int:
        """Device bytes of the buffers (what a capacity costs before any graph memory)."""
        total = 0
        for _, shape, dtype in self.entries:
            total += int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        return total


def plan_layout(state: Mapping[str, Any], capacity: int, max_len: int) -> StaticLayout:
    """The workspace layout for a decode whose encoder state is ``state`` (rows on axis 0), at ``capacity`` rows.

    Growing caches must be empty (the state right after ``encode``, axis 3 of size 0) or already static (size
    ``max_len``); every other entry keeps its per-row shape.
    """
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    entries = []
    for name, value in state.items():
        shape = tuple(int(s) for s in value.shape)
        if name in GROWING:
            if len(shape) != 5 or shape[3] not in (0, max_len):
                raise DecodeInputError(
                    f"state entry {name!r} has shape {shape}; the static step expects an empty (B, L, H, 0, d_k) "
                    f"cache from encode"
                )
            shape = (shape[0], shape[1], shape[2], max_len, shape[4])
        entries.append((name, (capacity, *shape[1:]), value.dtype))
    return StaticLayout(capacity, tuple(entries), max_len)


def padded_index(index: np.ndarray, capacity: int) -> np.ndarray:
    """(n,) row indices padded with row 0 to (capacity,): the rows past ``n`` are ignored, any valid row will do."""
    n = int(index.shape[0])
    if n > capacity:
        raise ValueError(f"{n} rows do not fit a workspace of capacity {capacity}")
    out = np.zeros(capacity, dtype=np.int64)
    out[:n] = index
    return out


class _Workspace:
    """Buffers (and, on CUDA, graphs and pinned host buffers) of one layout."""

    def __init__(self, layout: StaticLayout, device: torch.device, vocab: int) -> None:
        self.layout = layout
        self.capacity = layout.capacity
        self.device = device
        self.buffers = {name: torch.zeros(shape, dtype=dtype, device=device) for name, shape, dtype in layout.entries}
        self.tokens = torch.zeros(self.capacity, dtype=torch.long, device=device)
        self.parent = torch.zeros(self.capacity, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.positions = torch.arange(layout.max_len, device=device)
        self.logprobs = torch.zeros(self.capacity, vocab, dtype=torch.float32, device=device)
        pin = device.type == "cuda"
        self.tokens_host = torch.zeros(self.capacity, dtype=torch.long, pin_memory=pin)
        self.parent_host = torch.zeros(self.capacity, dtype=torch.long, pin_memory=pin)
        self.logprobs_host = torch.zeros(self.capacity, vocab, dtype=torch.float32, pin_memory=pin)
        self.step_graph: Any = None
        self.gather_graph: Any = None
        self.steps = 0  # host copy of the position counter
        self.live: State | None = None  # the views handed to the search last: a state is valid only if it is these

    def views(self, rows: int) -> State:
        self.live = {name: buf[:rows] for name, buf in self.buffers.items()}
        return self.live

    def reset(self) -> None:
        for name in GROWING:
            if name in self.buffers:
                self.buffers[name].zero_()  # finite junk is harmless (masked), but NaN from another decode is not
        self.position.zero_()
        self.steps = 0


class StaticStepModel:
    """:class:`~edgecap.runtime.decoding.StepModel` with static-shape caches (module docstring); built by
    :class:`~edgecap.workshop.torch_runtime.runtime.TorchStepModel` for ``step_mode`` other than ``"eager"``.

    Args:
        model: an ORT/ACORT ``CaptionModel`` already on ``device`` in eval mode.
        device: where it runs.
        mode: ``"static"``, ``"cuda-graph"`` or ``"compile"``.
        context: the precision/inference context of the owning adapter (a context-manager factory).
        warmup: eager runs before a capture (on a side stream, as CUDA graph capture requires).
    """

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        mode: str,
        context: Callable[[], contextlib.AbstractContextManager[Any]],
        warmup: int = 2,
    ) -> None:
        if mode not in STEP_MODES[1:]:
            raise StepModeError(f"StaticStepModel runs {list(STEP_MODES[1:])}, not {mode!r}")
        self.model, self.device, self.mode = model, device, mode
        self._context = context
        self.warmup = warmup
        self.capture = device.type == "cuda" and mode in ("cuda-graph", "compile")
        self._local = threading.local()
        self._lock = threading.Lock()  # one capture at a time: capture is process-wide on the device
        self._compiled: Callable[..., None] = _relation_transformer_static_step
        if mode == "compile":
            self._compiled = torch.compile(_relation_transformer_static_step, dynamic=False)
        self.captures = 0  # graphs captured (a test and the check script read it)

    # -- workspaces --------------------------------------------------------------------------------------------------
    def _workspaces(self) -> OrderedDict:
        cache = getattr(self._local, "workspaces", None)
        if cache is None:
            cache = self._local.workspaces = OrderedDict()
        return cache

    def _workspace(self, layout: StaticLayout) -> _Workspace:
        cache = self._workspaces()
        ws = cache.get(layout.key)
        if ws is None:
            ws = _Workspace(layout, self.device, int(self.model.vocab_size))
            if self.capture:
                self._capture(ws)
            cache[layout.key] = ws
            while len(cache) > MAX_WORKSPACES:
                cache.popitem(last=False)
        cache.move_to_end(layout.key)
        return ws

    def clear(self) -> None:
        """Free this thread's workspaces and graphs."""
        self._workspaces().clear()
        self._local.current = None

    def _capture(self, ws: _Workspace) -> None:
        """Capture the step and the gather of ``ws`` (warm-up on a side stream first, as ``torch.cuda.graph``
        requires); the warm-up runs write the buffers, which :meth:`encode` resets before use."""
        with self._lock, self._context():
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self._step_fn(ws)
                    _gather(ws)
            torch.cuda.current_stream(self.device).wait_stream(side)
            ws.step_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(ws.step_graph, capture_error_mode="thread_local"):
                self._step_fn(ws)
            ws.gather_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(ws.gather_graph, capture_error_mode="thread_local"):
                _gather(ws)
            torch.cuda.current_stream(self.device).synchronize()
        self.captures += 2

    def _current(self, state: State) -> _Workspace:
        ws = getattr(self._local, "current", None)
        live = None if ws is None else ws.live
        if live is None or any(state.get(name) is not view for name, view in live.items()):
            raise DecodeInputError(
                "this state is not the static-cache workspace of the current decode on this thread (one decode at a "
                "time per thread with step_mode other than 'eager')"
            )
        return cast(_Workspace, ws)  # live is set: the workspace of this decode

    # -- StepModel ---------------------------------------------------------------------------------------------------
    def encode_state(self, state: State) -> State:
        """Copy an eager encoder state into a workspace of its batch size; the search continues on its views."""
        rows = int(next(iter(state.values())).shape[0])
        ws = self._workspace(plan_layout(state, rows, int(self.model.max_len)))
        ws.reset()
        for name, value in state.items():
            if name in GROWING:
                continue
            ws.buffers[name].copy_(value)
        self._local.current = ws
        return ws.views(rows)

    def step(self, tokens: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        ws = self._current(state)
        rows = int(tokens.shape[0])
        if rows != int(state["self_k"].shape[0]):
            raise DecodeInputError(f"{rows} tokens for a state of {int(state['self_k'].shape[0])} rows")
        if ws.steps >= ws.layout.max_len:
            raise ValueError(
                f"decoder position {ws.steps} is past max_len={ws.layout.max_len}; positions are a fixed table"
            )
        host = ws.tokens_host.numpy()
        host[:rows] = np.asarray(tokens, dtype=np.int64)
        host[rows:] = 0
        ws.tokens.copy_(ws.tokens_host, non_blocking=True)
        if ws.step_graph is not None:
            ws.step_graph.replay()
        else:
            with self._context():
                self._step_fn(ws)
        ws.steps += 1
        if self.device.type == "cuda":
            ws.logprobs_host.copy_(ws.logprobs, non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()  # the search reads them now: the one sync per step
            out = ws.logprobs_host
        else:
            out = ws.logprobs
        # A view of the preallocated buffer, valid until the next step (docs/contracts.md, "StepModel"): no copy.
        return out[:rows].numpy(), state

    def select(self, state: State, index: np.ndarray) -> State:
        ws = self._current(state)
        index = np.asarray(index, dtype=np.int64)
        rows = int(index.shape[0])
        if rows > ws.capacity:  # beam expansion (B -> B·K): a workspace of the larger capacity, filled once
            return self._grow(ws, index)
        ws.parent_host.numpy()[:] = padded_index(index, ws.capacity)
        ws.parent.copy_(ws.parent_host, non_blocking=True)
        if ws.gather_graph is not None:
            ws.gather_graph.replay()
        else:
            with torch.inference_mode():
                _gather(ws)
        return ws.views(rows)

    def _grow(self, old: _Workspace, index: np.ndarray) -> State:
        rows = int(index.shape[0])
        layout = StaticLayout(rows, tuple((n, (rows, *s[1:]), d) for n, s, d in old.layout.entries), old.layout.max_len)
        ws = self._workspace(layout)
        with torch.inference_mode():
            rows_dev = torch.from_numpy(index).to(self.device, non_blocking=True)
            for name, buf in old.buffers.items():
                torch.index_select(buf, 0, rows_dev, out=ws.buffers[name])
            ws.position.copy_(old.position)
        ws.steps = old.steps
        self._local.current = ws
        return ws.views(rows)

    def _step_fn(self, ws: _Workspace) -> None:
        self._compiled(self.model, ws.tokens, ws.position, ws.positions, ws.logprobs, ws.buffers)


def _gather(ws: _Workspace) -> None:
    """Reorder every buffer's rows by ``ws.parent`` in place (a temporary, then a copy back)."""
    for buf in ws.buffers.values():
        buf.copy_(buf.index_select(0, ws.parent))


def _relation_transformer_static_step(
    model: nn.Module,
    tokens: Tensor,
    t: Tensor,
    positions: Tensor,
    logprobs: Tensor,
    bufs: dict[str, Tensor],
) -> None:
    """One decoder step of the Object Relation Transformer family (ORT/ACORT, ``edgecap.workshop.models.ort``; not ONNX
    Runtime) on the static buffers: the eager ``ORTCaptioner._step_impl`` with the cache written at the device-side
    position ``t`` (1,) instead of concatenated (see the module docstring); writes ``logprobs`` and advances ``t``.
    Plain tensors in, nothing returned, so ``torch.compile`` and CUDA graph capture see static addresses."""
    emb = model.embed
    x = emb.embed(tokens[:, None]) * emb.scale + emb.positions.table.index_select(0, t).to(emb.embed.weight.dtype)
    level = bufs.get("level_embed")
    x = emb.dropout(x if level is None else x + level)
    self_k, self_v = bufs["self_k"], bufs.get("self_v")
    zero = torch.zeros((), dtype=self_k.dtype, device=self_k.device)
    bias = torch.where(positions <= t, zero, torch.full_like(zero, MASK_VALUE))[None, None, None, :]
    cross_k, cross_v, memory_bias = bufs["cross_k"], bufs.get("cross_v"), bufs["memory_bias"]
    decoder = model.decoder
    for pos, layer in enumerate(decoder.layers):
        u = decoder.layers.layer_map[pos]
        ck = _unique_entry(cross_k, u)
        cv = ck if cross_v is None else _unique_entry(cross_v, u)
        q, k, v = layer.self_attn.project_self(layer.norm1(x))
        cache_k = self_k[:, pos]
        cache_k.index_copy_(2, t, k.to(cache_k.dtype))
        if self_v is not None:
            cache_v = self_v[:, pos]
            cache_v.index_copy_(2, t, v.to(cache_v.dtype))
        else:
            cache_v = cache_k
        x = x + layer.dropout(layer.self_attn.attend(q, cache_k, cache_v, bias))
        x = layer._cross_and_ffn(x, ck, cv, memory_bias)
    h = decoder.norm(x)
    logprobs.copy_(torch.log_softmax(model.output_proj(h[:, 0]), dim=-1))
    t.add_(1)
