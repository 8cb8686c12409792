"""Which frames of a stream get captioned: a :class:`Sampler` on the stream's own clock, and a :class:`ChangeGate` that
skips samples showing nothing new.

Sampling runs on the frames' timestamps, never on wall time: a file decoded five times faster than it plays must be
sampled exactly as when it plays, and a camera that stalls for a second must not produce a burst of samples after.

The gate compares pooled backbone embeddings by cosine distance. An embedding costs one encoder pass (for a
pixels-in bundle, the backbone is inside the encoder graph) but no decoding, which is most of a caption's cost with a
beam; on a static camera nearly every sample stops there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgecap.runtime.backends.registry import CaptionerError
from edgecap.runtime.stream.frames import Frame

__all__ = ["DEFAULT_CHANGE_THRESHOLD", "ChangeGate", "Sampler", "pool_state", "pooled_embedding"]

#: ``ChangeGate()``'s threshold, the suggested ``--on-change``: calibrated for acort-xsmall on synthetic scenes
#: (``docs/streams.md``, "Sampling and on-change", ``python -m tools.stream_threshold``): over twice the
#: distance camera noise and a ±10 % exposure change reach (0.022 at most), a third of the smallest change of scene
#: (0.145).
DEFAULT_CHANGE_THRESHOLD = 0.05
#: Timestamps this close (seconds) count as equal: a 30000/1001 fps stream's times are not exact in binary.
_EPS_S = 1e-6


def _positive(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise CaptionerError(f"{name} must be a positive number, got {value!r}")
    return float(value)


class Sampler:
    """Takes one frame per period of stream time: ``every_s`` seconds, or ``1 / fps``; neither takes every frame.

    The first frame is taken, then the first frame at or after each following multiple of the period counted from
    it (a frame at 0.0 s with ``every_s=0.5`` takes the frames at 0.5, 1.0, ...). A gap in the stream (a stalled
    camera) skips the periods it covers instead of catching up on them; a timestamp going backwards (a looping or
    restarted source) starts the count again from it.
    """

    def __init__(self, every_s: float | None = None, fps: float | None = None) -> None:
        if every_s is not None and fps is not None:
            raise CaptionerError("every and fps both choose the sampling: give one")
        self.every_s = _positive("every", every_s)
        self.fps = _positive("fps", fps)
        self.period_s = self.every_s if self.every_s is not None else (1.0 / self.fps if self.fps else None)
        self._origin: float | None = None
        self._last = 0.0
        self._next: int = 0  # the next period (a multiple of period_s after the origin) to take a frame in

    def take(self, frame: Frame) -> bool:
        """Whether ``frame`` is a sample; call it once per frame, in stream order."""
        if self.period_s is None:
            return True
        if self._origin is None or frame.pts_s < self._last - _EPS_S:
            self._origin, self._next = frame.pts_s, 1
            self._last = frame.pts_s
            return True
        self._last = frame.pts_s
        elapsed = frame.pts_s - self._origin
        if elapsed + _EPS_S < self._next * self.period_s:
            return False
        self._next = math.floor((elapsed + _EPS_S) / self.period_s) + 1
        return True


class ChangeGate:
    """Lets a sample through when its embedding is at least ``threshold`` (cosine distance, 0..2) away from the last
    sample it let through, the last CAPTIONED one: a slow drift is caught once it adds up, which comparing with the
    previous sample would miss."""

    def __init__(self, threshold: float = DEFAULT_CHANGE_THRESHOLD) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 2:
            raise CaptionerError(f"the on-change threshold is a cosine distance in [0, 2], got {threshold!r}")
        self.threshold = float(threshold)
        self.reference: np.ndarray | None = None
        self.last_distance: float | None = None

    def changed(self, embedding: np.ndarray) -> bool:
        """True (and it becomes the reference) for the first embedding and for one far enough from the reference."""
        unit = _unit(embedding)
        if self.reference is None:
            self.reference, self.last_distance = unit, None
            return True
        self.last_distance = distance = cosine_distance(self.reference, unit)
        if distance >= self.threshold:
            self.reference = unit
            return True
        return False

    def reset(self) -> None:
        """Forget the reference: the next sample passes."""
        self.reference = self.last_distance = None


def cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    """``1 - cos(a, b)`` of two vectors (0: same direction, 2: opposite; a zero vector is 1 away from any other)."""
    ua, ub = _unit(a), _unit(b)
    if not ua.any() and not ub.any():
        return 0.0
    return float(1.0 - np.clip(ua @ ub, -1.0, 1.0))


def _unit(vector: np.ndarray) -> np.ndarray:
    flat = np.asarray(vector, dtype=np.float64).reshape(-1)
    norm = float(np.linalg.norm(flat))
    return flat / norm if norm > 0 and math.isfinite(norm) else np.zeros_like(flat)


#: Encoder-state entries that hold the image's positions, in the order tried, with their position axis: the memory
#: itself where a model keeps it, else the first layer's cross-attention keys (a linear map of the memory, which is
#: all an ONNX encoder hands out).
_MEMORY_ENTRIES = (("memory_mean", None), ("memory", 1), ("visual", 1), ("cross_k", -2), ("branch_k", -2))
#: Entries that say which positions are real (0 bias / True) and which are padding.
_MASK_ENTRIES = ("memory_bias", "visual_bias", "feature_mask")


def pooled_embedding(captioner: Any, inputs: Mapping[str, Any]) -> np.ndarray:
    """``(B, D)`` float32 pooled embeddings of a batch of encoder inputs (what ``captioner.inputs(images)`` returns).

    Inputs that already are backbone features (``features``: a torch backbone ran in preprocessing, or region
    features) are mean-pooled over their positions, at no cost. Pixels (``pixel_values``: the backbone is inside the
    encoder graph) go through the step model's encoder once, and its state is pooled (:func:`pool_state`); image by
    image when the model's rows are coupled, so an embedding does not depend on its batch.
    """
    from edgecap.runtime.decoding.arrays import to_numpy

    if "features" in inputs:
        features = np.asarray(to_numpy(inputs["features"]), dtype=np.float32)
        mask = inputs.get("feature_mask")
        return _masked_mean(features, 1, None if mask is None else np.asarray(to_numpy(mask)).astype(bool))
    from edgecap.runtime.decoding.parallel import rows_independent_of

    model = captioner.step_model
    if rows_independent_of(model):
        return pool_state(model.encode(inputs))
    # a graph whose rows are coupled (dynamic INT8 quantises a whole batch at once): one image per call, so that a
    # sample's embedding, and the gate's decision on it, never depends on which samples shared its batch
    rows = len(next(iter(inputs.values())))
    return np.concatenate([pool_state(model.encode({k: v[i : i + 1] for k, v in inputs.items()})) for i in range(rows)])


def pool_state(state: Mapping[str, Any]) -> np.ndarray:
    """``(B, D)`` float32: the encoder state's memory (or its first layer's cross-attention keys, a linear map of it)
    mean-pooled over the image's real positions and flattened per image."""
    from edgecap.runtime.decoding.arrays import to_numpy

    for name, axis in _MEMORY_ENTRIES:
        if name in state:
            memory = np.asarray(to_numpy(state[name]), dtype=np.float32)
            if axis is None:
                return memory.reshape(memory.shape[0], -1)
            if name in ("cross_k", "branch_k") and memory.ndim == 5:
                memory = memory[:, 0]  # (B, layers, heads, N, d): the first layer is enough to see a change
            return _masked_mean(memory, axis, _valid(state, memory.shape[axis]))
    raise ValueError(f"no image memory among the encoder's outputs {sorted(state)}: the on-change gate cannot pool it")


def _valid(state: Mapping[str, Any], positions: int) -> np.ndarray | None:
    """(B, N) bool: the real positions, from the first mask entry the state has."""
    from edgecap.runtime.decoding.arrays import to_numpy

    for name in _MASK_ENTRIES:
        if name in state:
            mask = np.asarray(to_numpy(state[name]))
            mask = mask.reshape(mask.shape[0], -1)[:, -positions:]
            return mask if mask.dtype == bool else mask > -1.0  # an additive bias: 0 real, -1e4 or -inf padding
    return None


def _masked_mean(memory: np.ndarray, axis: int, valid: np.ndarray | None) -> np.ndarray:
    axis = axis % memory.ndim
    if valid is None:
        pooled = memory.mean(axis=axis)
    else:
        shape = [1] * memory.ndim
        shape[0], shape[axis] = valid.shape[0], valid.shape[1]
        weights = valid.reshape(shape).astype(np.float32)
        pooled = (memory * weights).sum(axis=axis) / np.maximum(weights.sum(axis=axis), 1.0)
    return pooled.reshape(pooled.shape[0], -1).astype(np.float32)
