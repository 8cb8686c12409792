"""The ``tensorrt`` runtime: a bundle's TensorRT engines (built by ``edgecap engine``) behind the same decoding
interfaces as every runtime, so the one numpy search drives them.

- :class:`TrtStepModel` (autoregressive bundles) is a :class:`~edgecap.runtime.decoding.StepModel` over the ``encoder``
  (init), ``step``, ``reorder`` and ``expand`` engines; :class:`TrtRefineModel` (LaBERT) a ``RefineModel`` over the
  ``encoder`` and ``refine`` engines.
- The state never leaves the device: it is a dict of :class:`DeviceTensor` views into buffers allocated once per batch
  shape (:mod:`edgecap.runtime.engines.buffers`). A step reads each cache from one copy and writes the next into the
  other;
  beam reordering runs the ``reorder`` gather engine (``expand`` when a carried state, such as the cross-attention
  keys, must change too: the first expansion from images to beams). Only the tokens and the row index go up and the
  log-probs come back, as the search needs them.
- Each thread gets its own execution contexts, stream and buffers (a worker); engines are shared. A worker is
  released when its thread ends (a finalizer on a per-thread token in ``threading.local``), so a server that starts a
  thread per request does not accumulate device memory, and each worker keeps the buffers of at most
  :data:`MAX_POOLS` batch shapes (least recently used freed first). Every thread makes the engines' CUDA device
  current (``cudaSetDevice``) before it allocates, creates a stream or context, or launches. Device memory, copies
  and streams go through cuda-python; nothing here needs torch.

The engines themselves (deserialising, contexts, launches: every TensorRT call) are in
:mod:`edgecap.runtime.backends.tensorrt.engines`.

An engine set is loaded only when its record matches this machine's TensorRT version and GPU and the bundle's graph
checksums, and its plans match their recorded checksums (:mod:`edgecap.runtime.engines.store`); otherwise loading
refuses,
naming the difference and the ``edgecap engine`` command that builds a fitting set.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgecap.runtime.backends.tensorrt.engines import (
    MAX_POOLS,
    DeviceTensor,
    TrtEngineError,
    _EngineSet,
    _launch,
    _Pool,
    _Worker,
)
from edgecap.runtime.decoding.protocol import DecodeInputError, State
from edgecap.runtime.engines.buffers import INDEX_NAME, plan_buffers
from edgecap.runtime.precisions import PRECISIONS

if TYPE_CHECKING:
    from edgecap.runtime.backends.registry import LoadedRuntime, LoadRequest
    from edgecap.runtime.bundle import Bundle

log = logging.getLogger(__name__)

__all__ = [
    "MAX_POOLS",
    "DeviceTensor",
    "TrtEngineError",
    "TrtRefineModel",
    "TrtStepModel",
    "load_bundle_runtime",
]

#: Engine precisions ``precision="auto"`` tries, best first: INT8, FP16, FP32 (the reverse of the listing order).
_AUTO_ORDER = tuple(reversed(PRECISIONS))


class _TrtModel:
    """What the step and refine models share: encoder inputs in, states on the device."""

    loop_role = "step"

    def __init__(self, engines: _EngineSet, state_names: Sequence[str], beam: int) -> None:
        self.engines = engines
        self.state_names = tuple(state_names)
        self.beam = beam

    def __enter__(self) -> Any:
        self.engines.__enter__()
        try:
            self._check_state_dtypes()
        except BaseException:
            self.engines.__exit__(None, None, None)
            raise
        return self

    def _check_state_dtypes(self) -> None:
        """Each state has one dtype in every engine that reads or writes it: the buffers hand bytes from one engine
        to the next, so a mismatch would be misread silently."""
        engines = self.engines.engines
        for name in self.state_names:
            seen = {}
            for role, engine in engines.items():
                for tensor in (name, f"{name}_out", f"{name}_gathered"):
                    if tensor in engine.dtypes:
                        seen[f"{role}:{tensor}"] = engine.dtypes[tensor]
            if len(set(seen.values())) > 1:
                shown = ", ".join(f"{k} {v}" for k, v in seen.items())
                raise TrtEngineError(f"state {name!r} has different dtypes across the engines ({shown}); rebuild them")

    def __exit__(self, *exc: object) -> None:
        self.engines.__exit__(*exc)

    def _pool(self, worker: _Worker, images: int) -> _Pool:
        pool = worker.pool(images)
        if pool is None:
            limit = self.engines.max_rows("encoder")
            if images > limit:
                raise TrtEngineError(
                    f"{images} images per call exceed the engines' max batch {limit}; rebuild with "
                    f"edgecap engine --max-batch {images}"
                )
            plan = plan_buffers(
                self.engines.io("encoder"),
                self.engines.io(self.loop_role),
                self.loop_role,
                self.state_names,
                self.engines.max_sizes(self.loop_role),
                images,
                self.beam,
            )
            pool = _Pool(plan)
            worker.add_pool(images, pool)
            log.debug("tensorrt: %d MiB of device buffers for %d images", plan.total_bytes >> 20, images)
        return pool

    def _check_rows(self, pool: _Pool, rows: int) -> None:
        capacity = pool.plan.images * pool.plan.beam
        if rows > capacity:
            raise TrtEngineError(
                f"{rows} hypotheses for {pool.plan.images} images exceed the engines' beam {self.beam} "
                f"({capacity} rows); decode with beam <= {self.beam} or rebuild with edgecap engine --beam"
            )

    def encode(self, inputs: Mapping[str, Any]) -> State:
        """Encoder inputs (numpy; cast to the engine's dtypes) -> the initial state on the device."""
        from edgecap.runtime.decoding.arrays import to_numpy

        engine = self.engines.engines["encoder"]
        missing = [n for n in engine.inputs if n not in inputs]
        unexpected = [n for n in inputs if n not in engine.inputs]
        if missing or unexpected:
            raise DecodeInputError(f"tensorrt encoder: inputs lack {missing}, unexpected {unexpected}")
        arrays = {n: np.ascontiguousarray(to_numpy(inputs[n]), dtype=engine.dtypes[n]) for n in engine.inputs}
        images = int(next(iter(arrays.values())).shape[0])
        worker = self.engines.worker()
        pool = self._pool(worker, images)
        for name, array in arrays.items():
            pool.buffer(name).upload(array, worker.stream)
        shapes = _launch(
            engine,
            worker.contexts["encoder"],
            {n: (pool.ptr(n), a.shape) for n, a in arrays.items()},
            {n: pool.ptr(n, 0) for n in self.state_names},
            worker.stream,
        )
        rows = tuple(range(images))
        return {n: DeviceTensor(pool, n, 0, shapes[n], rows) for n in self.state_names}


class TrtStepModel(_TrtModel):
    """A :class:`~edgecap.runtime.decoding.StepModel` over TensorRT engines (see the module docstring).

    Args:
        engines: the loaded engine set (roles ``encoder``, ``step``, ``reorder``, ``expand``).
        state_names: the step engine's state, in order; ``updated_state_names`` the ones it outputs.
        beam: the beam width the buffers are sized for (the set's).
    """

    loop_role = "step"

    def __init__(
        self,
        engines: _EngineSet,
        state_names: Sequence[str],
        updated_state_names: Sequence[str],
        beam: int,
        *,
        tokens_name: str = "tokens",
        logprobs_name: str = "logprobs",
        state_output_suffix: str = "_out",
    ) -> None:
        super().__init__(engines, state_names, beam)
        self.updated = tuple(n for n in self.state_names if n in set(updated_state_names))
        self.carried = tuple(n for n in self.state_names if n not in set(self.updated))
        self.tokens_name, self.logprobs_name, self.suffix = tokens_name, logprobs_name, state_output_suffix

    def step(self, tokens: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        """tokens (B,) int64 numpy -> ((B, V) float32 numpy log-probs, the state after them, on the device)."""
        engine = self.engines.engines["step"]
        worker = self.engines.worker()
        first = state[self.state_names[0]]
        pool = first.pool
        tokens = np.ascontiguousarray(tokens, dtype=engine.dtypes[self.tokens_name])
        self._check_rows(pool, tokens.shape[0])
        pool.buffer(self.tokens_name).upload(tokens, worker.stream)
        inputs = {self.tokens_name: (pool.ptr(self.tokens_name), tokens.shape)}
        inputs.update((n, (state[n].ptr, state[n].shape)) for n in self.state_names)
        outputs = {self.logprobs_name: pool.ptr(self.logprobs_name)}
        outputs.update((n + self.suffix, pool.ptr(n, 1 - state[n].copy)) for n in self.updated)
        shapes = _launch(engine, worker.contexts["step"], inputs, outputs, worker.stream)
        host = np.empty(shapes[self.logprobs_name], dtype=engine.dtypes[self.logprobs_name])
        pool.buffer(self.logprobs_name).download(host, worker.stream)
        new_state = dict(state)
        for name in self.updated:
            new_state[name] = DeviceTensor(pool, name, 1 - state[name].copy, shapes[name + self.suffix])
        return host.astype(np.float32, copy=False), new_state

    def select(self, state: State, index: np.ndarray) -> State:
        """Rows ``index`` of the state, gathered on the device: the ``reorder`` engine gathers the updated states; a
        carried state keeps its buffer when every row would be replaced by a copy of the same encoder row (beams of
        one image reordered), else ``expand`` gathers every state."""
        index = np.ascontiguousarray(index, dtype=np.int32)
        rows = index.tolist()
        origins: dict[str, tuple[int, ...]] = {}
        for name in self.carried:
            origin = state[name].origin
            if origin is None:
                raise DecodeInputError(f"tensorrt: carried state {name!r} lost its row origins")
            try:
                origins[name] = tuple(origin[r] for r in rows)
            except IndexError:
                raise DecodeInputError(f"select: index {max(rows)} out of range for {len(origin)} rows") from None
        keep = all(origins[n] == state[n].origin for n in self.carried)
        role = "reorder" if keep else "expand"
        names = self.updated if keep else self.state_names
        engine = self.engines.engines[role]
        worker = self.engines.worker()
        pool = state[self.state_names[0]].pool
        self._check_rows(pool, index.shape[0])
        pool.buffer(INDEX_NAME).upload(index, worker.stream)
        inputs = {INDEX_NAME: (pool.ptr(INDEX_NAME), index.shape)}
        inputs.update((n, (state[n].ptr, state[n].shape)) for n in names)
        outputs = {f"{n}_gathered": pool.ptr(n, 1 - state[n].copy) for n in names}
        shapes = _launch(engine, worker.contexts[role], inputs, outputs, worker.stream)
        out = dict(state)
        for name in names:
            out[name] = DeviceTensor(pool, name, 1 - state[name].copy, shapes[f"{name}_gathered"], origins.get(name))
        return out


class TrtRefineModel(_TrtModel):
    """LaBERT's ``RefineModel`` over the ``encoder`` and ``refine`` engines; levels, T, γ and the mask id come from
    the refine graph's metadata recorded in the engine set."""

    loop_role = "refine"

    def __init__(self, engines: _EngineSet, state_names: Sequence[str], metadata: Mapping[str, str]) -> None:
        import json

        super().__init__(engines, state_names, 1)
        needed = ("length_levels", "refine_steps", "eos_decay", "mask_id")
        absent = [k for k in needed if k not in metadata]
        if absent:
            raise TrtEngineError(f"the engine record lacks the refine graph's metadata {absent}; rebuild the engines")
        from edgecap.runtime.bundle.limits import check_length_plan

        plan = [json.loads(metadata[k]) for k in needed[:3]]
        check_length_plan(plan[0], plan[1], plan[2], f"{engines.folder}: the refine graph's metadata", TrtEngineError)
        self.length_levels = tuple((int(lo), int(hi)) for lo, hi in plan[0])
        self.refine_steps = tuple(int(t) for t in plan[1])
        self.eos_decay = tuple(float(g) for g in plan[2])
        self.mask_id = int(metadata["mask_id"])

    def refine(self, tokens: np.ndarray, length_level: np.ndarray, state: State) -> np.ndarray:
        """tokens (B, L), length_level (B,) int64 numpy -> (B, L, V) float32 numpy log-probs."""
        engine = self.engines.engines["refine"]
        worker = self.engines.worker()
        pool = state[self.state_names[0]].pool
        fed = {
            "tokens": np.ascontiguousarray(tokens, dtype=engine.dtypes["tokens"]),
            "length_level": np.ascontiguousarray(length_level, dtype=engine.dtypes["length_level"]),
        }
        for name, array in fed.items():
            pool.buffer(name).upload(array, worker.stream)
        inputs = {n: (pool.ptr(n), a.shape) for n, a in fed.items()}
        inputs.update((n, (state[n].ptr, state[n].shape)) for n in self.state_names)
        shapes = _launch(engine, worker.contexts["refine"], inputs, {"logprobs": pool.ptr("logprobs")}, worker.stream)
        host = np.empty(shapes["logprobs"], dtype=engine.dtypes["logprobs"])
        pool.buffer("logprobs").download(host, worker.stream)
        return host.astype(np.float32, copy=False)


# -- bundles on TensorRT (the registry's loader) --------------------------------------------------------------------
def _graph_shas(bundle: Bundle, precision: str) -> dict[str, str]:
    files = bundle.variant(precision)["files"]
    return {role: bundle.manifest["files"][files[role]]["sha256"] for role in bundle.interface["runtime_graphs"]}


def load_bundle_runtime(bundle: Bundle, request: LoadRequest) -> LoadedRuntime:
    """A bundle's TensorRT engines for ``Captioner.load(runtime="tensorrt")``.

    Precision ``"auto"``: the best engine set built for this machine (INT8, then FP16, then FP32). The set is checked
    against this TensorRT, GPU and the bundle's graph checksums, and its plans against their own checksums, before
    anything is deserialised.

    Raises:
        CaptionerError: TensorRT, cuda-python or a GPU is missing, TensorRT cannot start CUDA, or no engine set fits
            (the message says which ``edgecap engine`` command builds one).
    """
    from edgecap.runtime.backends.registry import CaptionerError, LoadedRuntime
    from edgecap.runtime.engines.build import EngineUnavailableError, current_env, load_tensorrt
    from edgecap.runtime.engines.store import EngineMismatchError, EngineRecordError, fitting_engines, verify_plans
    from edgecap.runtime.images.inputs import image_inputs

    device = _device_index(request.device)
    try:
        trt = load_tensorrt()
        env = current_env(trt, device)
    except EngineUnavailableError as exc:
        raise CaptionerError(f"runtime 'tensorrt': {exc}") from None
    candidates = (
        [request.precision] if request.precision != "auto" else [p for p in _AUTO_ORDER if p in bundle.precisions]
    )
    if request.precision != "auto":
        bundle.variant(request.precision)  # refuses, naming what the bundle holds
    mask_predict = bundle.decoding == "mask_predict"
    # the beam the search will decode with: the step engines' rows must hold it (mask-predict has no beam)
    beam = None if mask_predict else int(bundle.beam if request.beam is None else request.beam)
    found, errors = None, []
    for precision in candidates:
        try:
            sets = fitting_engines(Path(bundle.path), precision, env, _graph_shas(bundle, precision), beam=beam)
        except EngineMismatchError as exc:
            errors.append(str(exc))
            continue
        for folder, record in sets:  # best first; a set whose plans fail verification gives way to the next
            try:
                verify_plans(folder, record)
            except EngineRecordError as exc:
                errors.append(str(exc))
                continue
            found = (precision, folder, record)
            break
        if found is not None:
            break
    if found is None:
        raise CaptionerError(" | ".join(errors) or f"bundle {bundle.path} has no graphs to build engines from")
    precision, folder, record = found
    reason = "requested" if request.precision != "auto" else f"the best engine set built for {env.describe()}"
    if request.verify:
        bundle.verify(bundle.used_files())
    roles = ("encoder", "refine") if mask_predict else ("encoder", "step", *record.get("gathers", {}))
    engines = _EngineSet(folder, record, roles, device)
    if mask_predict:
        model: Any = TrtRefineModel(engines, bundle.state_names, record.get("metadata", {}))
    else:
        interface = bundle.interface
        model = TrtStepModel(
            engines,
            bundle.state_names,
            bundle.updated_state_names,
            int(record["request"]["beam"]),
            tokens_name=interface.get("tokens", "tokens"),
            logprobs_name=interface.get("logprobs", "logprobs"),
            state_output_suffix=interface.get("state_output_suffix", "_out"),
        )
    try:
        model.__enter__()
    except EngineUnavailableError as exc:  # TensorRT is installed but could not start CUDA
        raise CaptionerError(f"runtime 'tensorrt': {exc}") from None
    try:
        inputs, backbone, no_images = image_inputs(bundle, "cpu", bundle.backbone_in_graph)
    except BaseException:
        model.__exit__(None, None, None)
        raise
    info = {
        "device": f"cuda:{device}",
        "gpu": env.gpu_name,
        "tensorrt": env.trt_version,
        "engines": str(folder),
        "engine_request": dict(record.get("request", {})),
        "precision": precision,
        "precision_reason": reason,
        "backbone": backbone,
    }
    return LoadedRuntime(model, inputs, info, [model], no_images)


def _device_index(device: str | None) -> int:
    """``None``/``"cuda"`` -> 0, ``"cuda:N"`` -> N; anything else is refused (engines run on CUDA GPUs only)."""
    from edgecap.runtime.backends.registry import CaptionerError

    if device in (None, "cuda"):
        return 0
    text = str(device)
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise CaptionerError(f"runtime 'tensorrt' runs on CUDA devices ('cuda' or 'cuda:N'), not {device!r}")
