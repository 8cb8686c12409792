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


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the wire contract, as ``config.pbtxt`` declares it (PyTriton's ``Tensor`` in Triton's terms).

    Attributes:
        name: the tensor's name on the wire.
        dtype: its Triton config data type (``TYPE_STRING``, ``TYPE_UINT8``, ``TYPE_INT32``, ``TYPE_FP32``).
        shape: its dims without the batch dimension (-1: any size).
        optional: an input a request may leave out (outputs: False).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    optional: bool = False

    def __post_init__(self) -> None:
        if not self.dtype.startswith("TYPE_"):
            raise ValueError(f"tensor {self.name!r}: dtype must be a Triton config type (TYPE_...), got {self.dtype!r}")
        if not self.shape or any(d == 0 or d < -1 for d in self.shape):
            raise ValueError(f"tensor {self.name!r}: dims must be positive or -1, got {self.shape}")


#: Every input of the served model.
INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec(IMAGE, "TYPE_STRING", (1,), optional=True),
    TensorSpec(PIXELS, "TYPE_UINT8", (-1, -1, 3), optional=True),
    TensorSpec(LENGTH_LEVEL, "TYPE_INT32", (1,), optional=True),
    TensorSpec(BEAM, "TYPE_INT32", (1,), optional=True),
)
#: Every output of the served model.
OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec(CAPTION, "TYPE_STRING", (1,)),
    TensorSpec(TOKENS, "TYPE_INT32", (-1,)),
    TensorSpec(SCORE, "TYPE_FP32", (1,)),
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
