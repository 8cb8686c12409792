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


@dataclass(frozen=True)
class CaptionReply:
    """What a served captioner answers for one image."""

    caption: str
    tokens: tuple[int, ...] = ()
    score: float | None = None


class RequestError(ValueError):
    """A request the model refuses (not an image, wrong shape, level or beam out of range): its own error reply,
    never its batch-mates'."""
