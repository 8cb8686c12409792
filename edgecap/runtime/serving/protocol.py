"""The wire contract of a served captioner: tensor names, types and the per-request options.

Shared by the Python-backend model, the model repository's ``config.pbtxt`` and the client, so the three cannot
drift apart. Tensors follow the KServe v2 protocol that Triton speaks; every tensor has a leading batch dimension
(the model is batched), and one request may carry several images.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Encoded image bytes (JPEG, PNG, WebP, ...): one BYTES element per image.
IMAGE = "image"
#: Decoded pixels: an H×W×3 uint8 array per image. A request carries ``image`` or ``pixels``, never both.
PIXELS = "pixels"
#: Optional caption length level (1 = shortest; LaBERT and ``*-len`` models), one INT32 per image.
LENGTH_LEVEL = "length_level"
#: Optional beam width (1 = greedy), one INT32 per image.
BEAM = "beam"

#: The caption, one BYTES (UTF-8) element per image.
CAPTION = "caption"
#: The token ids of the caption (without BOS/EOS), padded with -1 to the longest in the request.
TOKENS = "tokens"
#: The ranking score of the caption (sum of log-probs, after the length penalty of a beam search).
SCORE = "score"

#: ``(name, Triton data type, dims without the batch dimension, optional)`` of every input.
INPUTS: tuple[tuple[str, str, tuple[int, ...], bool], ...] = (
    (IMAGE, "TYPE_STRING", (1,), True),
    (PIXELS, "TYPE_UINT8", (-1, -1, 3), True),
    (LENGTH_LEVEL, "TYPE_INT32", (1,), True),
    (BEAM, "TYPE_INT32", (1,), True),
)
#: ``(name, Triton data type, dims without the batch dimension)`` of every output.
OUTPUTS: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    (CAPTION, "TYPE_STRING", (1,)),
    (TOKENS, "TYPE_INT32", (-1,)),
    (SCORE, "TYPE_FP32", (1,)),
)

#: ``config.pbtxt`` parameters the model reads at load time.
PARAM_BUNDLE = "edgecap_bundle"
PARAM_RUNTIME = "edgecap_runtime"
PARAM_PRECISION = "edgecap_precision"
PARAM_THREADS = "edgecap_threads"
PARAM_MAX_PIXELS = "edgecap_max_pixels"
PARAM_MAX_BATCH_BYTES = "edgecap_max_batch_bytes"

#: Most pixels (width × height) of one image a served model decodes; checked from the header (encoded) or the shape
#: (``pixels``) before any decode. Below Pillow's decompression-bomb limit (89,478,485), above a 48 MP phone photo.
DEFAULT_MAX_PIXELS = 50_000_000
#: Most input bytes (encoded files and pixel arrays) one model instance takes into one batch: a request that would
#: go past it waits for a later batch (503, retried by the client); one that alone goes past it is refused (400).
DEFAULT_MAX_BATCH_BYTES = 256 << 20


@dataclass(frozen=True)
class CaptionReply:
    """What a served captioner answers for one image."""

    caption: str
    tokens: tuple[int, ...] = ()
    score: float | None = None


class RequestError(ValueError):
    """A request the model refuses (not an image, wrong shape, level or beam out of range): its own error reply,
    never its batch-mates'."""


class RequestBusyError(RequestError):
    """A request that fits the limits but not the batch it arrived in (the instance's byte budget is taken by its
    batch-mates): Triton's ``UNAVAILABLE`` (HTTP 503), which a client retries."""
