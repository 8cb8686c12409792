"""``RuntimeStepModel``: the decoding :class:`~edgecap.decoding.StepModel` on top of two graph-level runtimes.

Like optimum's ORT seq2seq models reusing one ``generate()``, any backend that can run an *encoder* graph and a
*decoder-step* graph gets greedy, beam search and sampling for free: the state is the step graph's flattened state
tensors in a fixed order, kept in the runtime's own array type (no host round trip for torch/CUDA arrays), and
beam reordering is a gather along axis 0.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edgecap.decoding.protocol import DecodeInputError, State
from edgecap.runtimes.base import Array, Runtime, RuntimeInputError


class ArrayOps(ABC):
    """Conversions between torch (the search's arrays) and a runtime's arrays."""

    @abstractmethod
    def from_torch(self, tensor: Tensor, dtype: str) -> Array:
        """A search tensor as this runtime's array of ``dtype``."""

    @abstractmethod
    def to_torch(self, array: Array) -> Tensor:
        """A runtime output as a torch tensor (zero-copy where possible)."""

    @abstractmethod
    def adopt(self, array: Array) -> Array:
        """Bring an array from another runtime into this one's type (e.g. encoder outputs into the step graph)."""

    @abstractmethod
    def take(self, array: Array, index: Tensor) -> Array:
        """Rows ``index`` of ``array`` along axis 0."""

    def take_all(self, state: Mapping[str, Array], index: Tensor) -> dict[str, Array]:
        """Rows ``index`` of every state array (the beam reorder)."""
        return {n: self.take(v, index) for n, v in state.items()}


class NumpyOps(ArrayOps):
    def from_torch(self, tensor: Tensor, dtype: str) -> np.ndarray:
        target = _numpy_dtype(dtype)
        if tensor.dtype == _TORCH_OF.get(target) and not tensor.requires_grad and tensor.is_cpu:
            array = tensor.numpy()  # the decode loop's case (int64 tokens into an int64 graph): a view, no copy
            if array.flags.c_contiguous:
                return array
        return np.ascontiguousarray(tensor.detach().cpu().numpy(), dtype=target)

    def to_torch(self, array: Array) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(array))

    def adopt(self, array: Array) -> np.ndarray:
        return array.detach().cpu().numpy() if isinstance(array, Tensor) else np.asarray(array)

    def take(self, array: Array, index: Tensor) -> np.ndarray:
        return np.take(array, _host_index(index), axis=0)

    def take_all(self, state: Mapping[str, Array], index: Tensor) -> dict[str, np.ndarray]:
        rows = _host_index(index)  # converted once for all state arrays
        return {n: np.take(v, rows, axis=0) for n, v in state.items()}


class TorchOps(ArrayOps):
    def from_torch(self, tensor: Tensor, dtype: str) -> Tensor:
        return tensor.to(getattr(torch, dtype))

    def to_torch(self, array: Array) -> Tensor:
        return array

    def adopt(self, array: Array) -> Tensor:
        return array if isinstance(array, Tensor) else torch.from_numpy(np.ascontiguousarray(array))

    def take(self, array: Array, index: Tensor) -> Tensor:
        return array.index_select(0, index.to(array.device))


ARRAY_OPS: dict[str, ArrayOps] = {"numpy": NumpyOps(), "torch": TorchOps()}

#: numpy dtype -> the torch dtype whose ``.numpy()`` has it (the zero-copy case of ``NumpyOps.from_torch``).
_TORCH_OF = {
    np.dtype(n): getattr(torch, n) for n in ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")
}


@functools.cache
def _numpy_dtype(name: str) -> np.dtype:
    return np.dtype(name)


def _host_index(index: Tensor) -> np.ndarray:
    """A row index as a numpy array (a view when it is a CPU tensor already, as the searches make it)."""
    return index.numpy() if index.is_cpu and not index.requires_grad else index.detach().cpu().numpy()


def array_ops(runtime: Runtime) -> ArrayOps:
    ops = ARRAY_OPS.get(runtime.array_type)
    if ops is None:
        raise ValueError(f"{runtime.name}: unsupported array_type {runtime.array_type!r}; known: {sorted(ARRAY_OPS)}")
    return ops


class GraphPair:
    """An encoder runtime plus the runtime of the graph a decoding loop calls repeatedly (``step`` or ``refine``):
    activated together as a context manager, and the encoder run with the decode inputs checked against the graph.

    Args:
        encoder: the encoder runtime (decode inputs -> the initial state).
        loop: the runtime the loop calls; its array type is the one the state is kept in.
        state_names: the encoder outputs that form the state.
    """

    def __init__(self, encoder: Runtime, loop: Runtime, state_names: Sequence[str]) -> None:
        if not state_names:
            raise ValueError(f"{type(self).__name__} needs at least one state name")
        self.encoder, self.loop_runtime = encoder, loop
        self.state_names = tuple(state_names)
        self._enc_ops, self._loop_ops = array_ops(encoder), array_ops(loop)

    def __enter__(self) -> Any:
        self.encoder.activate()
        try:
            self.loop_runtime.activate()
        except BaseException:
            self.encoder.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.loop_runtime.close()
        finally:
            self.encoder.close()

    def run_encoder(self, inputs: Mapping[str, Tensor]) -> State:
        """The initial state, in the loop runtime's array type (inputs cast to the dtypes the graph declares)."""
        meta = self.encoder.input_metadata()
        missing = [n for n in meta if n not in inputs]
        if missing:
            raise RuntimeInputError(
                f"{self.encoder.name}: decode inputs lack {missing} (given {sorted(inputs)}, graph takes {list(meta)})"
            )
        unexpected = [n for n in inputs if n not in meta]
        if unexpected:
            raise RuntimeInputError(f"{self.encoder.name}: the graph has no input(s) {unexpected} (takes {list(meta)})")
        feed = {n: self._enc_ops.from_torch(_as_tensor(inputs[n]), m.dtype) for n, m in meta.items()}
        outputs = self.encoder.infer(feed)
        absent = [n for n in self.state_names if n not in outputs]
        if absent:
            raise DecodeInputError(f"{self.encoder.name}: outputs lack state(s) {absent} (got {sorted(outputs)})")
        return {n: self._loop_ops.adopt(outputs[n]) for n in self.state_names}


class RuntimeStepModel(GraphPair):
    """A :class:`~edgecap.decoding.StepModel` driving an encoder runtime and a decoder-step runtime.

    Graph contract:

    - ``encoder``: inputs = the decode inputs (e.g. ``features``, ``boxes``, ``feature_mask``), outputs ⊇
      ``state_names`` — the initial state (batch on axis 0).
    - ``step``: inputs = ``tokens_name`` (B,) + every ``state_names`` entry; outputs = ``logprobs_name`` (B, V) +
      the new value of each ``updated_state_names`` entry under ``state_output_names`` (same order; graph outputs
      cannot reuse input names). States not updated (cross-attention keys/values) are carried to the next step as
      they are, so the graph need not copy them out every step.

    Inputs are cast to the dtype each graph declares (e.g. fp32 features into an fp16 engine, int64 tokens into an
    int32 graph), so the search stays backend-agnostic.

    Args:
        encoder: the encoder runtime.
        step: the decoder-step runtime.
        state_names: the state tensors, in the step graph's order.
        updated_state_names: the states the step graph outputs; default all of ``state_names``.
        tokens_name: the step graph's token input.
        logprobs_name: the step graph's log-prob output.
        state_output_names: step outputs holding the new state; default ``f"{name}_out"`` per updated state.
    """

    def __init__(
        self,
        encoder: Runtime,
        step: Runtime,
        state_names: Sequence[str],
        *,
        tokens_name: str = "tokens",
        logprobs_name: str = "logprobs",
        state_output_names: Sequence[str] | None = None,
        updated_state_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__(encoder, step, state_names)
        updated = self.state_names if updated_state_names is None else tuple(updated_state_names)
        unknown = [n for n in updated if n not in self.state_names]
        if unknown:
            raise ValueError(f"updated_state_names {unknown} are not state names {list(self.state_names)}")
        self.updated_state_names = tuple(n for n in self.state_names if n in updated)
        self.state_output_names = tuple(state_output_names or (f"{n}_out" for n in self.updated_state_names))
        if len(self.state_output_names) != len(self.updated_state_names):
            raise ValueError(
                f"state_output_names has {len(self.state_output_names)} names for "
                f"{len(self.updated_state_names)} updated states"
            )
        self._token_dtype: str | None = None
        self.tokens_name, self.logprobs_name = tokens_name, logprobs_name
        self._state_outputs = tuple(zip(self.updated_state_names, self.state_output_names, strict=True))
        self._carried = frozenset(self.state_names) - frozenset(self.updated_state_names)
        # carried state name -> (the array select() last returned for it, the row of the array it was gathered
        # from that each of its rows copies); see select()
        self._origins: dict[str, tuple[Array, tuple[int, ...]]] = {}

    @property
    def step_runtime(self) -> Runtime:
        """The decoder-step runtime."""
        return self.loop_runtime

    def __enter__(self) -> RuntimeStepModel:
        self._token_dtype = None
        self._origins.clear()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        self._origins.clear()  # holds carried state arrays: let them go with the sessions
        super().__exit__(*exc)

    # -- StepModel ---------------------------------------------------------------------------------------------------
    def encode(self, inputs: Mapping[str, Tensor]) -> State:
        self._origins.clear()
        return self.run_encoder(inputs)

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        token_dtype = self._token_dtype
        if token_dtype is None:  # looked up once per activation: the decode loop calls this every token
            token_meta = self.step_runtime.input_metadata().get(self.tokens_name)
            if token_meta is None:
                raise RuntimeInputError(
                    f"{self.step_runtime.name}: the step graph has no token input {self.tokens_name!r}"
                )
            token_dtype = self._token_dtype = token_meta.dtype
        feed: dict[str, Array] = {self.tokens_name: self._loop_ops.from_torch(tokens, token_dtype)}
        for name in self.state_names:
            feed[name] = state[name]
        outputs = self.loop_runtime.infer(feed)
        try:
            logprobs = self._loop_ops.to_torch(outputs[self.logprobs_name])
            if logprobs.dtype != torch.float32:
                logprobs = logprobs.float()
            new_state = dict(state)
            for name, output in self._state_outputs:
                new_state[name] = outputs[output]
        except KeyError:
            absent = [n for n in (self.logprobs_name, *self.state_output_names) if n not in outputs]
            raise DecodeInputError(f"{self.step_runtime.name}: outputs lack {absent} (got {sorted(outputs)})") from None
        return logprobs, new_state

    def select(self, state: State, index: Tensor) -> State:
        """Rows ``index`` of every state array; a carried state (one the step graph does not update, e.g. the
        cross-attention keys) is returned as it is when the gather would not change its content.

        After the first expansion (B images -> B·K beams) every beam of an image holds an identical copy of the
        image's rows in a carried state, and reordering beams within an image leaves it as it was. So each carried
        array this method returns is remembered with the source row each of its rows copies; when the same array
        comes back and ``index`` maps every row to a copy of the same source row, the gather is skipped. Equal
        source rows mean bitwise-equal rows, so the result is exactly what the gather would give.
        """
        if not self._carried or not index.is_cpu:  # a device index: no host read per step
            return self._loop_ops.take_all(state, index)
        ops, origins, carried = self._loop_ops, self._origins, self._carried
        if isinstance(ops, NumpyOps):
            host = _host_index(index)  # converted once for all state arrays

            def gather(value: Array) -> Array:
                return np.take(value, host, axis=0)

            rows = host.tolist()
        else:
            gather = functools.partial(ops.take, index=index)
            rows = index.tolist()
        out: State = {}
        for name, value in state.items():
            if name not in carried:
                out[name] = gather(value)
                continue
            known = origins.get(name)
            if known is not None and known[0] is value:
                try:
                    source = tuple([known[1][r] for r in rows])
                except IndexError:  # out of range: let the gather raise its own error
                    source = None
                if source == known[1]:  # every row would be replaced by an identical row
                    out[name] = value
                    continue
            else:
                source = tuple(rows)
            out[name] = gather(value)
            if source is not None:
                origins[name] = (out[name], source)
        return out


def _as_tensor(value: Any) -> Tensor:
    return value if isinstance(value, Tensor) else torch.as_tensor(np.asarray(value))
