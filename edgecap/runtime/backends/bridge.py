"""``RuntimeStepModel``: the decoding :class:`~edgecap.runtime.decoding.StepModel` on top of two graph-level runtimes.

Like optimum's ONNX Runtime seq2seq models reusing one ``generate()``, any backend that can run an *encoder* graph and a
*decoder-step* graph gets greedy, beam search and sampling for free: the state is the step graph's flattened state
tensors in a fixed order, kept in the runtime's own array type (no host round trip for torch/CUDA arrays), and
beam reordering is a gather along axis 0.

The search hands over int64 numpy tokens and row indices and reads numpy log-probs (``docs/contracts.md``,
"StepModel"). On ONNX Runtime's CPU path (``array_type == "numpy"``) there is nothing to convert; the io-binding path
(``array_type == "torch"``) converts at this boundary with the workshop half's ``TorchOps``
(:mod:`edgecap.runtime.torch_hooks`), so this module never imports torch.
"""

from __future__ import annotations

import functools
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgecap.runtime.backends.base import IMAGE_DIM, Array, Runtime, RuntimeInputError
from edgecap.runtime.decoding.arrays import to_numpy
from edgecap.runtime.decoding.parallel import check_decode_workers
from edgecap.runtime.decoding.protocol import DecodeInputError, State


class ArrayOps(ABC):
    """Conversions between the search's arrays (numpy; decode inputs may also be torch tensors) and a runtime's."""

    @abstractmethod
    def feed(self, value: Any, dtype: str) -> Array:
        """A search array or decode input (numpy, torch …) as this runtime's array of ``dtype``."""

    def logprobs(self, array: Array) -> np.ndarray:
        """A runtime's log-prob output as float32 numpy, as the search reads it (zero-copy where possible)."""
        return to_numpy(array, np.float32)

    @abstractmethod
    def adopt(self, array: Array) -> Array:
        """Bring an array from another runtime into this one's type (e.g. encoder outputs into the step graph)."""

    @abstractmethod
    def take(self, array: Array, index: np.ndarray) -> Array:
        """Rows ``index`` (int64 numpy) of ``array`` along axis 0."""

    def take_all(self, state: Mapping[str, Array], index: np.ndarray) -> dict[str, Array]:
        """Rows ``index`` of every state array (the beam reorder)."""
        return {n: self.take(v, index) for n, v in state.items()}


class NumpyOps(ArrayOps):
    """ONNX Runtime on CPU: the search's numpy arrays are the runtime's, nothing to convert on the decode loop."""

    def feed(self, value: Any, dtype: str) -> np.ndarray:
        array = to_numpy(value, _numpy_dtype(dtype))
        return array if array.flags.c_contiguous else np.ascontiguousarray(array)

    def adopt(self, array: Array) -> np.ndarray:
        return to_numpy(array)

    def take(self, array: Array, index: np.ndarray) -> np.ndarray:
        return np.take(array, index, axis=0)


#: Array types whose operations live in the runtime half; ``"torch"`` comes from the workshop half
#: (:func:`edgecap.runtime.torch_hooks.torch_hook`), only when a runtime keeps its state in torch tensors.
ARRAY_OPS: dict[str, ArrayOps] = {"numpy": NumpyOps()}


@functools.cache
def _numpy_dtype(name: str) -> np.dtype:
    return np.dtype(name)


def array_ops(runtime: Runtime) -> ArrayOps:
    ops = ARRAY_OPS.get(runtime.array_type)
    if ops is None and runtime.array_type == "torch":
        from edgecap.runtime.torch_hooks import torch_hook

        ops = torch_hook("torch_arrays")
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

    Attributes:
        rows_independent: every row of a loop-graph call is computed as if it were alone in the call. False for a
            graph whose activations are quantised with one scale per call (a ``dynamic`` INT8 step:
            ``DynamicQuantizeLinear``), where a batch's rows change each other's outputs; ``decode`` then decodes
            each image on its own (:mod:`edgecap.runtime.decoding.parallel`), so a caption never depends on its batch.
            Set
            by :func:`~edgecap.runtime.backends.onnxruntime.decoders.create_onnxruntime_decoder` from the graphs'
            recorded INT8 schemes.
    """

    rows_independent: bool = True

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
        # Chosen again once the runtimes are active: one asked for CUDA that runs on the CPU (its GPU provider did not
        # start) switches from torch tensors to numpy then, and the state must follow it.
        self._enc_ops, self._loop_ops = array_ops(self.encoder), array_ops(self.loop_runtime)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.loop_runtime.close()
        finally:
            self.encoder.close()

    def run_encoder(self, inputs: Mapping[str, Any]) -> State:
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
        feed = {n: self._enc_ops.feed(inputs[n], m.dtype) for n, m in meta.items()}
        outputs = self.encoder.infer(feed)
        absent = [n for n in self.state_names if n not in outputs]
        if absent:
            raise DecodeInputError(f"{self.encoder.name}: outputs lack state(s) {absent} (got {sorted(outputs)})")
        return {n: self._loop_ops.adopt(outputs[n]) for n in self.state_names}


class RuntimeStepModel(GraphPair):
    """A :class:`~edgecap.runtime.decoding.StepModel` driving an encoder runtime and a decoder-step runtime.

    Graph contract:

    - ``encoder``: inputs = the decode inputs (e.g. ``features``, ``boxes``, ``feature_mask``), outputs ⊇
      ``state_names`` — the initial state (batch on axis 0).
    - ``step``: inputs = ``tokens_name`` (B,) + every ``state_names`` entry; outputs = ``logprobs_name`` (B, V) +
      the new value of each ``updated_state_names`` entry under ``state_output_names`` (same order; graph outputs
      cannot reuse input names). States not updated (cross-attention keys/values) are carried to the next step as
      they are, so the graph need not copy them out every step.

    Inputs are cast to the dtype each graph declares (e.g. fp32 features into an fp16 engine, int64 tokens into an
    int32 graph), so the search stays backend-agnostic.

    *Image states*: a carried state whose step input has the leading dimension ``images`` (instead of ``batch``) is
    kept with one row per image while every image's hypotheses sit in consecutive rows, as beam search keeps them;
    the step graph attends per image (``docs/decoding.md``). :meth:`select` falls back to one row per hypothesis for
    any other order, which the graph also takes.

    Args:
        encoder: the encoder runtime.
        step: the decoder-step runtime.
        state_names: the state tensors, in the step graph's order.
        updated_state_names: the states the step graph outputs; default all of ``state_names``.
        tokens_name: the step graph's token input.
        logprobs_name: the step graph's log-prob output.
        state_output_names: step outputs holding the new state; default ``f"{name}_out"`` per updated state.
        decode_workers: decodes that may run on this model at once, each on a chunk of a batch's images
            (:func:`~edgecap.runtime.decoding.decode` splits greedy and beam batches; ``ThreadPlan.decode_workers``).
            The
            runtimes must take concurrent calls, as ONNX Runtime sessions do.
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
        decode_workers: int = 1,
    ) -> None:
        super().__init__(encoder, step, state_names)
        self.decode_workers = check_decode_workers(decode_workers)
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
        self._image_states: tuple[str, ...] | None = None  # read from the step graph on first use
        # per thread (decodes of a split batch run at once): carried state name -> (the array select() last
        # returned for it, the row of the array it was gathered from that each of its rows copies); see select()
        self._local = threading.local()

    @property
    def _origins(self) -> dict[str, tuple[Array, tuple[int, ...]]]:
        origins = getattr(self._local, "origins", None)
        if origins is None:
            origins = self._local.origins = {}
        return origins

    @property
    def step_runtime(self) -> Runtime:
        """The decoder-step runtime."""
        return self.loop_runtime

    def __enter__(self) -> RuntimeStepModel:
        self._token_dtype = None
        self._image_states = None
        self._origins.clear()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        self._local = threading.local()  # holds carried state arrays: let them go with the sessions
        super().__exit__(*exc)

    # -- StepModel ---------------------------------------------------------------------------------------------------
    def encode(self, inputs: Mapping[str, Any]) -> State:
        """inputs: the decode inputs, numpy arrays or torch tensors (cast to the dtypes the encoder declares)."""
        self._origins.clear()
        return self.run_encoder(inputs)

    def step(self, tokens: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        """tokens: (B,) int64 numpy. Returns (B, V) float32 numpy log-probs and the state in the runtime's arrays."""
        token_dtype = self._token_dtype
        if token_dtype is None:  # looked up once per activation: the decode loop calls this every token
            token_meta = self.step_runtime.input_metadata().get(self.tokens_name)
            if token_meta is None:
                raise RuntimeInputError(
                    f"{self.step_runtime.name}: the step graph has no token input {self.tokens_name!r}"
                )
            token_dtype = self._token_dtype = token_meta.dtype
        feed: dict[str, Array] = {self.tokens_name: self._loop_ops.feed(tokens, token_dtype)}
        for name in self.state_names:
            feed[name] = state[name]
        outputs = self.loop_runtime.infer(feed)
        try:
            logprobs = self._loop_ops.logprobs(outputs[self.logprobs_name])
            new_state = dict(state)
            for name, output in self._state_outputs:
                new_state[name] = outputs[output]
        except KeyError:
            absent = [n for n in (self.logprobs_name, *self.state_output_names) if n not in outputs]
            raise DecodeInputError(f"{self.step_runtime.name}: outputs lack {absent} (got {sorted(outputs)})") from None
        return logprobs, new_state

    @property
    def image_states(self) -> tuple[str, ...]:
        """The carried states the step graph takes once per image (leading dimension ``images``); empty for graphs
        exported before image states, which take every state once per hypothesis."""
        names = self._image_states
        if names is None:
            meta = self.step_runtime.input_metadata()
            names = tuple(
                n for n in self.state_names if n in self._carried and n in meta and meta[n].shape[:1] == (IMAGE_DIM,)
            )
            if len(names) == len(self.state_names):  # nothing left to count the hypotheses by
                names = ()
            self._image_states = names
        return names

    def select(self, state: State, index: np.ndarray) -> State:
        """Rows ``index`` of every state array; image states (see the class docstring) stay one row per image;
        another carried state (one the step graph does not update) is returned as it is when the gather would not
        change its content.

        After the first expansion (B images -> B·K beams) every beam of an image holds an identical copy of the
        image's rows in a carried state, and reordering beams within an image leaves it as it was. So each carried
        array this method returns is remembered with the source row each of its rows copies; when the same array
        comes back and ``index`` maps every row to a copy of the same source row, the gather is skipped. Equal
        source rows mean bitwise-equal rows, so the result is exactly what the gather would give.
        """
        index = np.asarray(to_numpy(index), dtype=np.int64)
        if not self._carried:
            return self._loop_ops.take_all(state, index)
        ops, origins, carried = self._loop_ops, self._origins, self._carried
        gather = functools.partial(ops.take, index=index)
        rows = index.tolist()
        out: State = self._select_image_states(state, index)
        for name, value in state.items():
            if name in out:
                continue
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

    def _select_image_states(self, state: State, index: np.ndarray) -> State:
        """The image states after ``select(state, index)``: one row per image while ``index`` keeps every image's
        hypotheses consecutive and equally many, else one row per hypothesis."""
        names = self.image_states
        if not names:
            return {}
        images = int(state[names[0]].shape[0])
        hypotheses = next(int(v.shape[0]) for n, v in state.items() if n not in names)
        if images < 1 or hypotheses % images or any(int(state[n].shape[0]) != images for n in names):
            raise DecodeInputError(
                f"{self.step_runtime.name}: {hypotheses} hypotheses cannot share the image states "
                f"{ {n: tuple(state[n].shape) for n in names} } (one row per image, or per hypothesis)"
            )
        sources = index // (hypotheses // images)  # the image row each new hypothesis reads
        grouped = image_groups(sources)
        if grouped is not None:
            sources = grouped
        if sources.shape[0] == images and np.array_equal(sources, np.arange(images)):
            return {n: state[n] for n in names}  # the same images in the same order: nothing to gather
        return {n: self._loop_ops.take(state[n], sources) for n in names}


def image_groups(sources: np.ndarray) -> np.ndarray | None:
    """The image of each group when ``sources`` (the image of every hypothesis) lists k copies of each image in a
    row, k the same for all (beam search's order), else None."""
    count = sources.shape[0]
    if count == 0:
        return None
    change = np.flatnonzero(sources[1:] != sources[:-1])
    width = int(change[0]) + 1 if change.size else count
    if count % width:
        return None
    blocks = sources.reshape(-1, width)
    if width > 1 and not (blocks == blocks[:, :1]).all():
        return None
    return blocks[:, 0]
