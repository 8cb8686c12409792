"""One dynamic batch of served requests -> one reply or one error per request.

Triton's dynamic batcher hands the model whatever requests arrived together, from different users. Two rules make
that safe (``docs/serving.md``):

* **One bad request never fails its batch-mates.** Every request is checked and its images decoded on its own; a
  request that fails gets its own :class:`~edgecap.runtime.serving.protocol.RequestError`, the rest are captioned.
* **A caption never depends on its batch-mates.** Images that ask for the same decoding (beam, length level) are
  decoded together, and edgecap's decoders are batch-invariant (``tests/test_captioner_batch_invariance.py``);
  images that ask for different decodings are grouped by :meth:`Captioner.caption
  <edgecap.runtime.captioner.Captioner.caption>`, one decode per group, because a beam width or a length level is a
  property of the whole decode call.

Before anything is decoded every request is bounded: each image's pixels (from the encoded header or the array's
shape) against ``max_pixels``, and the input bytes the batch holds against ``max_batch_bytes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from edgecap.runtime.serving.protocol import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_PIXELS,
    CaptionReply,
    RequestBusyError,
    RequestError,
)

if TYPE_CHECKING:
    from edgecap.runtime.captioner import Captioner

#: One served image: its encoded bytes (JPEG, PNG, ...) or its decoded H×W×3 uint8 pixels.
ServedImage = bytes | np.ndarray
#: ``(beam, length_level)`` of one image; ``Captioner.caption`` decodes images with the same key in one call.
DecodeKey = tuple[int | None, int | None]


@dataclass
class ServedRequest:
    """One client request: its images (encoded bytes or H×W×3 uint8 arrays) and, per image, the options it asks."""

    images: list[ServedImage]
    beams: list[int | None] = field(default_factory=list)
    length_levels: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        count = len(self.images)
        self.beams = self.beams or [None] * count
        self.length_levels = self.length_levels or [None] * count
        if len(self.beams) != count or len(self.length_levels) != count:
            raise RequestError(
                f"{count} image(s) but {len(self.beams)} beam and {len(self.length_levels)} length_level value(s)"
            )


class ServedCaptioner:
    """A :class:`~edgecap.runtime.captioner.Captioner` answering batches of independent requests.

    Args:
        captioner: the loaded captioner (its decode config is the default of every request).
        batch_size: most images per decode call (Triton's ``max_batch`` bounds a batch; this bounds memory when one
            request carries many images).
        max_pixels: most pixels (width × height) of one image; a larger one is refused from its header or shape.
        max_batch_bytes: most input bytes (encoded files, pixel arrays) the requests of one batch hold; a request
            that alone is larger is refused, one that only does not fit beside its batch-mates is busy.
    """

    def __init__(
        self,
        captioner: Captioner,
        batch_size: int = 1024,
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    ) -> None:
        self.captioner = captioner
        self.batch_size = batch_size
        self.max_pixels = max_pixels
        self.max_batch_bytes = max_batch_bytes

    def answer(self, requests: Sequence[ServedRequest]) -> list[list[CaptionReply] | RequestError]:
        """Replies for each request in order: its captions, or the error that refused it."""
        from edgecap.runtime.images.load import ImageError

        results: list[list[CaptionReply] | RequestError | None] = [None] * len(requests)
        prepared: list[tuple[int, list[dict[str, np.ndarray]], list[DecodeKey]]] = []
        held = 0  # input bytes of the requests admitted into this batch
        for index, request in enumerate(requests):
            try:
                keys = [self._decode_key(b, lv) for b, lv in zip(request.beams, request.length_levels, strict=True)]
                size = self._check_bounds(request, held)
                held += size
                inputs = [self._encoder_inputs(image) for image in request.images]
            except (RequestError, ImageError, ValueError) as exc:
                results[index] = exc if isinstance(exc, RequestError) else RequestError(str(exc))
                continue
            prepared.append((index, inputs, keys))

        slots = [(index, slot) for index, inputs, _ in prepared for slot in range(len(inputs))]
        rows = [one for _, inputs, _ in prepared for one in inputs]
        keys = [key for _, _, request_keys in prepared for key in request_keys]
        for index, inputs, _ in prepared:
            results[index] = [CaptionReply("")] * len(inputs)
        for (index, slot), reply in zip(slots, self._decode(rows, keys), strict=True):
            replies = results[index]
            assert isinstance(replies, list)
            replies[slot] = reply
        return [r if r is not None else RequestError("not answered") for r in results]

    # -- one request -------------------------------------------------------------------------------------------------
    def _decode_key(self, beam: int | None, level: int | None) -> DecodeKey:
        """Check a request's options before any work, with ``Captioner``'s own rules and words."""
        try:
            self.captioner.check_options(beam=beam, length_level=level)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        return (beam, level)

    def _check_bounds(self, request: ServedRequest, held: int) -> int:
        """The request's input bytes, once each image's pixels and the batch's bytes are within bounds; nothing is
        decoded here (an encoded image's size comes from its header)."""
        from edgecap.runtime.images.load import image_size

        size = 0
        for image in request.images:
            if isinstance(image, np.ndarray):
                if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
                    raise RequestError(f"pixels must be an H×W×3 uint8 array, got shape {image.shape} {image.dtype}")
                height, width = image.shape[:2]
            else:
                width, height = image_size(image)
            if width * height > self.max_pixels:
                raise RequestError(
                    f"image of {width}×{height} = {width * height} pixels is over this server's limit of "
                    f"{self.max_pixels} pixels per image"
                )
            size += image.nbytes if isinstance(image, np.ndarray) else len(image)
        if size > self.max_batch_bytes:
            raise RequestError(f"request of {size} bytes is over this server's limit of {self.max_batch_bytes} bytes")
        if held + size > self.max_batch_bytes:
            raise RequestBusyError(
                f"server busy: this batch already holds {held} of {self.max_batch_bytes} bytes; send the request again"
            )
        return size

    def _encoder_inputs(self, image: ServedImage) -> dict[str, np.ndarray]:
        """One image -> its encoder inputs (batch 1): decoded and preprocessed here, so a bad image fails alone (an
        array's shape and dtype were checked by :meth:`_check_bounds`, which runs first)."""
        return self.captioner.prepare([image])

    # -- the decode ----------------------------------------------------------------------------------------------------
    def _decode(self, rows: list[dict[str, np.ndarray]], keys: list[DecodeKey]) -> list[CaptionReply]:
        """Every checked image of the batch in one ``Captioner.caption`` call, each at its own options (the
        captioner groups them: one decode per beam and level, ``batch_size`` images at most)."""
        if not rows:
            return []
        batch = {name: np.concatenate([one[name] for one in rows]) for name in rows[0]}
        beams, levels = [beam for beam, _ in keys], [level for _, level in keys]
        captions = self.captioner.caption(batch, beam=beams, length_level=levels, batch_size=self.batch_size)
        return [CaptionReply(c.text, c.tokens, c.score) for c in captions]
