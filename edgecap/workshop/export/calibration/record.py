"""Recording the decoder-step feeds a real decoding run produces, to calibrate the step graph on them.

The step graph's inputs are the previous token and the decoder state: cross-attention keys/values and a
self-attention cache that grows by one position per step. Random tensors are poor calibration data for it: the
cache's values, its length distribution and the tokens all come from the model's own decoding. So we decode the
calibration images with the FP32 model (greedy or beam search, exactly the deployed :class:`DecodeCfg`) and keep the
feeds of the step calls — what optimum and ONNX Runtime leave to their users.

Memory stays bounded: :class:`FeedRecorder` keeps every ``every``-th step feed and at most ``max_feeds`` of them (and at
most ``max_bytes``), as a uniform random sample of all steps once the cap is reached (reservoir sampling, Vitter's
Algorithm R, seeded), so late steps with long caches are represented as well as early ones; ``max_rows`` keeps a
random subset of a step's hypotheses (beam search feeds B·K rows, each holding its image's cross-attention keys).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from edgecap.runtime.decoding import DecodeCfg, decode
from edgecap.runtime.decoding.arrays import to_numpy
from edgecap.runtime.decoding.protocol import State, StepModel
from edgecap.workshop.export.calibration.source import CalibrationError, CalibrationSource, Feed, as_feed, as_source

__all__ = ["FeedRecorder", "RecordingStepModel", "record_decoder_feeds"]


class FeedRecorder:
    """A bounded, ordered sample of step feeds.

    Args:
        max_feeds: keep at most this many feeds (>= 1).
        every: consider only every ``every``-th feed offered (1 = all), a cheap first subsampling.
        seed: seed of the reservoir and row sampling.
        max_rows: keep at most this many rows (hypotheses) of a feed, a seeded random subset taken alike from every
            tensor (all of them have the batch on axis 0); None keeps all. Beam search feeds B·K rows per step.
        max_bytes: stop growing the sample once the kept feeds hold this many bytes; later feeds then only replace
            kept ones (the reservoir shrinks to the size reached). None: no byte budget.
    """

    def __init__(
        self,
        max_feeds: int = 512,
        every: int = 1,
        seed: int = 0,
        *,
        max_rows: int | None = None,
        max_bytes: int | None = None,
    ) -> None:
        for label, value in (("max_feeds", max_feeds), ("every", every), ("max_rows", max_rows or 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CalibrationError(f"FeedRecorder: {label} must be an integer >= 1, got {value!r}")
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1):
            raise CalibrationError(f"FeedRecorder: max_bytes must be an integer >= 1 or None, got {max_bytes!r}")
        self.max_feeds, self.every, self.max_rows, self.max_bytes = max_feeds, every, max_rows, max_bytes
        self._rng = random.Random(seed)
        self._rows_rng = np.random.default_rng(seed)
        self._kept: list[tuple[int, Feed]] = []  # (arrival index among considered feeds, feed)
        self._capacity = max_feeds
        self.nbytes = 0  # memory held by the kept feeds
        self.offered = 0  # feeds offered to add()
        self.considered = 0  # feeds that passed the ``every`` filter

    def add(self, feed: Mapping[str, Any]) -> bool:
        """Offer one feed; returns whether it was kept (its arrays are copied, the caller may reuse buffers)."""
        self.offered += 1
        if (self.offered - 1) % self.every:
            return False
        index = self.considered
        self.considered += 1
        copied = None
        if len(self._kept) < self._capacity:
            copied = self._copy(feed)
            size = _feed_bytes(copied)
            if self.max_bytes is None or self.nbytes + size <= self.max_bytes or not self._kept:
                self._kept.append((index, copied))
                self.nbytes += size
                return True
            self._capacity = len(self._kept)  # the byte budget is reached: the reservoir stops growing
        slot = self._rng.randrange(self.considered)  # Algorithm R: keep with probability capacity / considered
        if slot < self._capacity:
            copied = copied if copied is not None else self._copy(feed)
            self.nbytes += _feed_bytes(copied) - _feed_bytes(self._kept[slot][1])
            self._kept[slot] = (index, copied)
            return True
        return False

    def _copy(self, feed: Mapping[str, Any]) -> Feed:
        arrays = as_feed(feed, "recorded step feed")
        rows = {a.shape[0] for a in arrays.values() if a.ndim}
        if self.max_rows is not None and len(rows) == 1 and next(iter(rows)) > self.max_rows:
            keep = np.sort(self._rows_rng.choice(next(iter(rows)), self.max_rows, replace=False))
            return {name: np.ascontiguousarray(a[keep]) if a.ndim else a.copy() for name, a in arrays.items()}
        return {name: np.array(a, copy=True) for name, a in arrays.items()}

    @property
    def feeds(self) -> list[Feed]:
        """The kept feeds in the order they were recorded."""
        return [feed for _, feed in sorted(self._kept, key=lambda item: item[0])]

    def __len__(self) -> int:
        return len(self._kept)

    def source(self, name: str = "decoder feeds") -> CalibrationSource:
        """The kept feeds as a (list-backed, re-iterable) :class:`CalibrationSource`."""
        return CalibrationSource(self.feeds, name=name)

    def stats(self, length_axis: tuple[str, int] | None = None) -> dict[str, Any]:
        """JSON-ready summary: feeds offered/kept, bytes, rows per feed and the range of one axis (e.g. the cache
        length)."""
        out: dict[str, Any] = {
            "offered": self.offered,
            "kept": len(self),
            "every": self.every,
            "max_rows": self.max_rows,
            "bytes": self.nbytes,
        }
        rows = [next(iter(f.values())).shape[0] for _, f in self._kept if next(iter(f.values())).ndim]
        if rows:
            out["batch_rows"] = [int(min(rows)), int(max(rows))]
        if length_axis is not None:
            name, axis = length_axis
            sizes = [f[name].shape[axis] for _, f in self._kept if name in f and f[name].ndim > axis]
            if sizes:
                out[f"{name}_axis{axis}"] = [int(min(sizes)), int(max(sizes))]
        return out


def _feed_bytes(feed: Feed) -> int:
    return sum(a.nbytes for a in feed.values())


class RecordingStepModel:
    """A :class:`~edgecap.runtime.decoding.StepModel` that offers every step's graph feed to a :class:`FeedRecorder`.

    The recorded feed is what a step graph takes: ``{tokens_name: tokens, **state}`` with tokens as ``token_dtype``
    and each state entry in ``state_names`` as a numpy array (torch tensors are copied to the CPU). For a
    ``RuntimeStepModel`` over ONNX Runtime this is exactly the feed of its step session.

    Args:
        inner: the step model that decodes (usually the FP32 reference).
        recorder: where feeds go.
        state_names: the state entries the step graph takes, in order.
        tokens_name: the step graph's token input.
        token_dtype: dtype of the recorded tokens (the graph's declared token dtype).
    """

    def __init__(
        self,
        inner: StepModel,
        recorder: FeedRecorder,
        state_names: Sequence[str],
        *,
        tokens_name: str = "tokens",
        token_dtype: Any = np.int64,
    ) -> None:
        if not state_names:
            raise CalibrationError("RecordingStepModel needs the step graph's state names")
        self.inner, self.recorder = inner, recorder
        self.state_names, self.tokens_name = tuple(state_names), tokens_name
        self.token_dtype = np.dtype(token_dtype)
        self.steps = 0

    def encode(self, inputs: Mapping[str, Any]) -> State:
        return self.inner.encode(inputs)

    def step(self, tokens: np.ndarray, state: State) -> tuple[Any, State]:
        missing = [n for n in self.state_names if n not in state]
        if missing:
            raise CalibrationError(f"the decoder state lacks {missing} (has {sorted(state)}); check state_names")
        feed = {self.tokens_name: to_numpy(tokens, self.token_dtype)}
        feed.update((n, state[n]) for n in self.state_names)
        self.recorder.add(feed)
        self.steps += 1
        return self.inner.step(tokens, state)

    def select(self, state: State, index: np.ndarray) -> State:
        return self.inner.select(state, index)


def record_decoder_feeds(
    step_model: StepModel,
    inputs: Iterable[Mapping[str, Any]] | CalibrationSource,
    cfg: DecodeCfg,
    state_names: Sequence[str],
    *,
    recorder: FeedRecorder | None = None,
    tokens_name: str = "tokens",
    token_dtype: Any = np.int64,
    on_batch: Callable[[int, Feed], None] | None = None,
) -> FeedRecorder:
    """Decode every batch of ``inputs`` with ``step_model`` and record the step feeds.

    Args:
        step_model: the (FP32) step model, ready to decode (a ``RuntimeStepModel`` must be entered).
        inputs: decode-input batches (encoder feeds), e.g. ``{"features", "boxes", "feature_mask"}``.
        cfg: the decoding configuration to record under (the deployed one: beam search records the beams' states).
        state_names: the step graph's state inputs.
        recorder: where to record; default a new ``FeedRecorder()`` (512 feeds).
        tokens_name, token_dtype: the step graph's token input and its dtype.
        on_batch: called with ``(index, batch)`` after each batch is decoded (progress, or keeping the batches).

    Returns:
        The recorder.

    Raises:
        CalibrationError: ``inputs`` yielded no batch, or decoding produced no step feed.
    """
    recorder = recorder if recorder is not None else FeedRecorder()
    wrapped = RecordingStepModel(step_model, recorder, state_names, tokens_name=tokens_name, token_dtype=token_dtype)
    batches = 0
    for index, batch in enumerate(as_source(inputs, "decoder calibration inputs")):
        decode(wrapped, dict(batch), cfg)  # numpy inputs: every step model's adapter converts them
        batches += 1
        if on_batch is not None:
            on_batch(index, batch)
    if batches == 0:
        raise CalibrationError("empty calibration set: no encoder feeds to decode")
    if len(recorder) == 0:
        raise CalibrationError(f"no decoder feeds recorded from {batches} batch(es)")
    return recorder
