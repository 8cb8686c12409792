"""The Triton Python-backend model that captions with edgecap: ``TritonPythonModel`` for a model repository.

A repository's ``model.py`` imports this class (:mod:`~edgecap.runtime.serving.repository` writes it), so the model
Triton runs is edgecap's own runtime and search, the same code as ``Captioner``. It runs inside Triton's Python
backend stub, where ``triton_python_backend_utils`` exists; edgecap must be installed in the Python environment the
stub runs (``edgecap serve`` arranges that; ``docs/serving.md`` says how for the official container).

Why the Python backend and not PyTriton's ``Triton.bind``: PyTriton hands a batch to one callable and turns an
exception into an error for every request of that batch; the Python backend answers each request on its own
(``InferenceResponse(error=...)``), which is what "one bad request never fails its batch-mates" needs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

import numpy as np

from edgecap.runtime.serving.batch import ServedCaptioner, ServedImage, ServedRequest
from edgecap.runtime.serving.protocol import (
    BEAM,
    CAPTION,
    IMAGE,
    LENGTH_LEVEL,
    PARAM_BUNDLE,
    PARAM_MAX_BATCH_BYTES,
    PARAM_MAX_PIXELS,
    PARAM_PRECISION,
    PARAM_RUNTIME,
    PARAM_THREADS,
    PIXELS,
    SCORE,
    TOKENS,
    CaptionReply,
    RequestBusyError,
    RequestError,
)

if TYPE_CHECKING:
    from edgecap.runtime.captioner import Captioner

#: A model config as Triton hands it to ``initialize`` (``json.loads(args["model_config"])``).
ModelConfigJSON = Mapping[str, object]


class TritonRequest(Protocol):
    """What this model uses of a Python-backend ``InferenceRequest`` (its inputs are read through ``pb_utils``)."""

    def requested_output_names(self) -> list[str]: ...


def model_parameters(model_config: ModelConfigJSON) -> dict[str, str]:
    """``config.pbtxt`` ``parameters`` as plain strings (Triton gives ``{"key": {"string_value": "..."}}``)."""
    parameters = model_config.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise ValueError(f"model config parameters must be a mapping, got {type(parameters).__name__}")
    return {str(k): str(v["string_value"]) for k, v in parameters.items()}


def load_captioner(model_config: ModelConfigJSON, version_dir: Path) -> Captioner:
    """The captioner a repository model names: its bundle (inside the version directory) on its runtime."""
    from edgecap.runtime.captioner import Captioner

    params = model_parameters(model_config)
    name = Path(params.get(PARAM_BUNDLE, "bundle"))
    if name.is_absolute() or ".." in name.parts:
        raise ValueError(f"{PARAM_BUNDLE} must be a path inside the model version directory, got {str(name)!r}")
    bundle = version_dir / name
    threads: int | str = params.get(PARAM_THREADS, "auto")
    if isinstance(threads, str) and threads.isdigit():
        threads = int(threads)
    return Captioner.load(
        bundle,
        runtime=params.get(PARAM_RUNTIME, "auto"),
        precision=params.get(PARAM_PRECISION, "auto"),
        threads=threads,
    )


def served_captioner(model_config: ModelConfigJSON, captioner: Captioner) -> ServedCaptioner:
    """The captioner behind the request bounds the config names (``edgecap_max_pixels``,
    ``edgecap_max_batch_bytes``; the defaults of :class:`ServedCaptioner` when absent)."""
    params = model_parameters(model_config)
    bounds = {}
    for key, param in (("max_pixels", PARAM_MAX_PIXELS), ("max_batch_bytes", PARAM_MAX_BATCH_BYTES)):
        if param in params:
            value = params[param]
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"{param} must be a positive integer, got {value!r}")
            bounds[key] = int(value)
    return ServedCaptioner(captioner, **bounds)


def _one_request(request: TritonRequest, pb_utils: ModuleType) -> ServedRequest:
    """A Triton request -> its images and options, or a :class:`RequestError` naming what is wrong with it."""
    encoded = pb_utils.get_input_tensor_by_name(request, IMAGE)
    pixels = pb_utils.get_input_tensor_by_name(request, PIXELS)
    if (encoded is None) == (pixels is None):
        raise RequestError(f"send exactly one of {IMAGE!r} (encoded bytes) or {PIXELS!r} (H×W×3 uint8)")
    if encoded is not None:
        images: list[ServedImage] = [bytes(item) for item in encoded.as_numpy().reshape(-1)]
    else:
        images = list(pixels.as_numpy())
    return ServedRequest(
        images,
        _per_image(request, BEAM, len(images), pb_utils),
        _per_image(request, LENGTH_LEVEL, len(images), pb_utils),
    )


def _per_image(request: TritonRequest, name: str, count: int, pb_utils: ModuleType) -> list[int | None]:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return [None] * count
    values = tensor.as_numpy().reshape(-1)
    if values.size != count:
        raise RequestError(f"{name}: {values.size} value(s) for {count} image(s)")
    return [int(v) for v in values]


def _response(replies: list[CaptionReply], requested: set[str], pb_utils: ModuleType) -> object:
    outputs = [pb_utils.Tensor(CAPTION, np.array([[r.caption.encode()] for r in replies], dtype=np.object_))]
    if TOKENS in requested:
        width = max((len(r.tokens) for r in replies), default=0)
        tokens = np.full((len(replies), width), -1, dtype=np.int32)
        for row, reply in enumerate(replies):
            tokens[row, : len(reply.tokens)] = reply.tokens
        outputs.append(pb_utils.Tensor(TOKENS, tokens))
    if SCORE in requested:
        scores = [[np.nan if r.score is None else r.score] for r in replies]
        outputs.append(pb_utils.Tensor(SCORE, np.array(scores, dtype=np.float32)))
    return pb_utils.InferenceResponse(output_tensors=outputs)


class TritonPythonModel:
    """Triton's Python-backend entry points: ``initialize``, ``execute`` (one dynamic batch), ``finalize``."""

    def initialize(self, args: Mapping[str, str]) -> None:
        config = json.loads(args["model_config"])
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.served = served_captioner(config, load_captioner(config, version_dir))

    def execute(self, requests: list[TritonRequest]) -> list[object]:
        import triton_python_backend_utils as pb_utils

        parsed: list[ServedRequest | RequestError] = []
        for request in requests:
            try:
                parsed.append(_one_request(request, pb_utils))
            except RequestError as exc:
                parsed.append(exc)
            except Exception as exc:  # a malformed tensor: this request's error, not the batch's
                parsed.append(RequestError(f"malformed request: {exc}"))
        good = [p for p in parsed if isinstance(p, ServedRequest)]
        try:
            answers = iter(self.served.answer(good))
            failure = None
        except Exception as exc:  # the runtime itself failed: every good request says so, none hangs
            answers, failure = (
                iter(()),
                pb_utils.TritonError(f"captioning failed: {exc}", pb_utils.TritonError.INTERNAL),
            )
        responses = []
        for request, item in zip(requests, parsed, strict=True):
            if failure is not None and isinstance(item, ServedRequest):
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=failure))
                continue
            result = next(answers) if isinstance(item, ServedRequest) else item
            if isinstance(result, RequestError):
                code = "UNAVAILABLE" if isinstance(result, RequestBusyError) else "INVALID_ARG"
                error = pb_utils.TritonError(str(result), getattr(pb_utils.TritonError, code))
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
            else:
                responses.append(_response(result, set(request.requested_output_names()), pb_utils))
        return responses

    def finalize(self) -> None:
        self.served.captioner.close()
