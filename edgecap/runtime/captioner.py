"""The embedded API: images in, captions out, from a bundle or a trained run.

    from edgecap import Captioner
    cap = Captioner.load("bundles/acort-xsmall")    # verified bundle; the best runtime and provider installed
    print(cap("photo.jpg"), cap.runtime_info["summary"])

    cap = Captioner.from_run("acort-xsmall")         # a run directory, or a model name trained earlier (torch)

``Captioner.load`` imports numpy, Pillow, the bundle reader, the decoding package and the chosen runtime's engine:
no torch, no training code, unless the torch runtime is asked for. Runtimes are found through the registry in
:mod:`edgecap.runtime.backends.registry`, so a new runtime is one module plus its registration.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from edgecap.runtime.backends.registry import CaptionerError
from edgecap.runtime.images.inputs import BackboneMismatchError, PixelInputs
from edgecap.runtime.precisions import PRECISIONS

if TYPE_CHECKING:
    from edgecap.runtime.stream.pipeline import CaptionStream

log = logging.getLogger(__name__)


__all__ = [
    "BackboneMismatchError",
    "Captioner",
    "CaptionerError",
    "PixelInputs",
    "SkippedImageWarning",
    "bundle_decode_cfg",
]


class SkippedImageWarning(UserWarning):
    """``Captioner.batch(..., errors="skip")`` left out an image it could not load or preprocess."""

    def __init__(self, index: int, image: Any, error: Exception) -> None:
        super().__init__(f"image {index} skipped: {error}")
        self.index, self.image, self.error = index, image, error


# -- the captioner ---------------------------------------------------------------------------------------------------
class Captioner:
    """Images -> encoder inputs -> a :class:`~edgecap.runtime.decoding.StepModel` -> captions; call it on one image or
    use
    :meth:`batch`.

    Args:
        inputs: images -> encoder inputs (:class:`PixelInputs`, or the workshop half's torch ``BackboneInputs``), or
        None when captions can
            only come from precomputed features (:meth:`caption_inputs`); ``no_images_reason`` then says why.
        step_model: torch, ONNX Runtime or TensorRT adapter.
        vocab: decodes token ids to words.
        decode_cfg: how to decode.
        runtime_info: what was chosen and why (``Captioner.load`` fills it).
        resources: objects closed by :meth:`close` (runtime sessions).
        length_levels: ``((L_low, L_high), ...)`` of a length-controllable model, for clear range errors when the
            step model cannot tell (an ONNX ``*-len`` encoder); ``()`` = ask the step model.
    """

    def __init__(
        self,
        inputs: Any,
        step_model: Any,
        vocab: Any,
        decode_cfg: Any,
        *,
        runtime_info: dict[str, Any] | None = None,
        resources: Sequence[Any] = (),
        no_images_reason: str = "",
        length_levels: Sequence[Sequence[int]] = (),
    ) -> None:
        self.inputs = inputs
        self.step_model = step_model
        self.vocab = vocab
        self.decode_cfg = decode_cfg
        self.runtime_info: dict[str, Any] = dict(runtime_info or {})
        self._resources = list(resources)
        self._no_images_reason = no_images_reason
        self.length_levels = tuple((int(lo), int(hi)) for lo, hi in length_levels)

    @property
    def backbone(self) -> Any:
        """The torch backbone (None when it is inside the ONNX graph, or absent)."""
        return getattr(self.inputs, "backbone", None)

    # -- constructors ----------------------------------------------------------------------------------------------
    @classmethod
    def from_run(
        cls, run: str | Path, device: str = "cpu", beam: int | None = None, backbone_weights: str | Path | None = None
    ) -> Captioner:
        """A captioner on the torch weights of a trained run (a run directory or a model name trained earlier);
        ``beam`` default 3 (a mask-predict model, LaBERT, takes none: see :meth:`load`). Needs the ``[train]``
        extra: the run is decoded in torch (:mod:`edgecap.workshop.torch_runtime.run_captioner`)."""
        from edgecap.runtime.torch_hooks import TorchUnavailableError, torch_hook

        if beam is not None:
            _check_beam(beam)  # before loading the run
        try:
            from_run = torch_hook("captioner_from_run")
        except TorchUnavailableError as exc:
            raise CaptionerError(f"Captioner.from_run({str(run)!r}): {exc}") from None
        return from_run(cls, run, device=device, beam=beam, backbone_weights=backbone_weights)

    @classmethod
    def load(
        cls,
        bundle: str | Path,
        runtime: str = "auto",
        precision: str = "auto",
        beam: int | None = None,
        threads: int | str | None = "auto",
        *,
        spin: bool | None = None,
        streams: int = 1,
        providers: Sequence[str] | str | None = None,
        device: str | None = None,
        verify: bool = True,
        step_mode: str = "eager",
        trt_opt_batch: int | None = None,
        trt_workspace_mb: int | None = None,
    ) -> Captioner:
        """Load a bundle on the best available runtime, verifying what it reads.

        Args:
            bundle: a bundle directory (``edgecap export``), or the name of a model exported without ``--out``
                (``$EDGECAP_HOME/bundles/NAME``, where the quickstart writes).
            runtime: ``"auto"`` (the first installed of the registered runtimes: ONNX Runtime, then torch) or a
                registered name (:func:`edgecap.runtime.backends.list_runtimes`: ``"onnxruntime"``, ``"torch"``, …).
            precision: ``"auto"`` (best for the runtime and provider: INT8 on a CPU its preset suits, FP16 on
                CUDA/TensorRT, else FP32), or ``"fp32"``/``"fp16"``/``"int8"``.
            beam: beam size (1 = greedy); default the bundle's (3). A mask-predict bundle (LaBERT) refines one
                hypothesis: a beam above 1 is refused (:data:`NO_BEAM_SEARCH`), as a length level is on a model
                without length control.
            threads: ONNX Runtime's threads on CPU (``docs/cpu.md``): ``"auto"`` (default: one intra-op thread per
                stream, never spinning, and on two or more usable cores per stream a second session with those cores
                for calls of many rows, i.e. batch work; created on the first such call), ``"dedicated"``
                (cores this process owns: a large step graph gets them, spinning), or an intra-op count (``0`` = ONNX
                Runtime's own default).
                The choice is in ``runtime_info["threads"]``. Process-wide settings (``torch.set_num_threads``) are
                never changed: set them yourself.
            spin: let ONNX Runtime's pool threads spin while waiting (True) or not (False); default the policy's.
            streams: how many decodes will run at once in this process (e.g. ``batch`` called from N threads).
            providers: ONNX Runtime providers in priority order (``"tensorrt"``, ``"cuda"``, ``"cpu"``); default
                TensorRT, then CUDA when this onnxruntime build has them, then CPU.
            device: torch device for the torch runtime and a torch backbone; default CUDA when available.
            verify: check the size of every file and the SHA-256 of the files this runtime reads (config, vocab,
                the chosen precision's graphs or the torch weights, backbone weights); leave on.
            step_mode: the torch runtime's decoder step: ``"eager"`` (default), ``"static"``, ``"cuda-graph"``
                (captured once per batch shape, replayed per token), ``"compile"`` or ``"auto"`` (``cuda-graph`` on
                CUDA where the model supports it); see ``docs/gpu.md``.
            trt_opt_batch: images per call ONNX Runtime's TensorRT provider tunes its engines for (default 8; the
                step graph's rows are this times ``beam``); the engines still take any batch the bundle allows.
            trt_workspace_mb: the TensorRT provider's workspace limit in MiB (default 1024, sized for a Jetson;
                0 = the provider's own, the whole device memory).

        The choice and the reasons are in :attr:`runtime_info` and logged (logger ``edgecap.runtime.captioner``, INFO).

        Raises:
            edgecap.runtime.bundle.BundleError: the bundle is corrupt, incomplete, inconsistent or too new.
            CaptionerError: a runtime/precision the bundle or this machine cannot serve (the message says what to
                install).
        """
        from edgecap.runtime.backends.registry import (
            LoadRequest,
            UnknownRuntimeError,
            auto_runtime,
            get_runtime,
            list_runtimes,
        )
        from edgecap.runtime.backends.threads import ThreadSettingError, check_threads
        from edgecap.runtime.bundle.layout import find_bundle
        from edgecap.runtime.bundle.reader import load_bundle

        if precision != "auto" and precision not in PRECISIONS:
            raise CaptionerError(f"precision must be 'auto' or one of {list(PRECISIONS)}, got {precision!r}")
        try:
            check_threads(threads, spin, streams)
        except ThreadSettingError as exc:
            raise CaptionerError(str(exc)) from None
        try:
            if runtime == "auto":
                spec, runtime_reason = auto_runtime()
            else:
                spec, runtime_reason = get_runtime(runtime), "requested"
                ok, why = spec.available()
                if not ok:
                    raise CaptionerError(why)
            load = spec.load_function()
        except UnknownRuntimeError as exc:
            raise CaptionerError(str(exc)) from None
        if step_mode not in spec.step_modes:
            raise CaptionerError(
                f"runtime {spec.name!r} runs its decoder step as {list(spec.step_modes)}, not step_mode={step_mode!r}"
            )
        if precision != "auto" and precision not in spec.precisions:
            able = [n for n in list_runtimes(baselines=False) if precision in get_runtime(n).precisions]
            raise CaptionerError(
                f"runtime {spec.name!r} runs {list(spec.precisions)}, not {precision!r}: {precision.upper()} graphs "
                f"need runtime={' or '.join(repr(n) for n in able) or 'none registered'}"
            )
        opened = load_bundle(find_bundle(bundle) or bundle, verify="used" if verify else False, graphs="none")
        check_beam_applies(beam, opened.decoding)
        beam = opened.beam if beam is None else beam
        _check_beam(beam)
        request = LoadRequest(
            precision=precision,
            threads=threads,
            spin=spin,
            streams=streams,
            providers=providers,
            device=device,
            verify=verify,
            step_mode=step_mode,
            beam=beam,
            trt_opt_batch=trt_opt_batch,
            trt_workspace_mb=trt_workspace_mb,
        )
        loaded = load(opened, request)
        try:
            vocab = opened.load_vocab()
            cfg = bundle_decode_cfg(opened, vocab, beam)
        except BaseException:
            for resource in loaded.resources:
                resource.__exit__(None, None, None)
            raise
        info = {"runtime": spec.name, "runtime_reason": runtime_reason, **loaded.info, "beam": beam}
        info.update(decoding=cfg.strategy, length_level=cfg.length_level)
        info.update(bundle=str(opened.path), model=opened.name)
        info["summary"] = _describe(info)
        log.info("Captioner.load(%s): %s", opened.path, info["summary"])
        return cls(
            loaded.inputs, loaded.step_model, vocab, cfg, runtime_info=info, resources=loaded.resources,
            no_images_reason=loaded.no_images_reason, length_levels=opened.length_levels,
        )  # fmt: skip

    # -- captioning ------------------------------------------------------------------------------------------------
    def __call__(self, image: Any, length_level: int | None = None) -> str:
        """The caption of one image; ``length_level`` (1-based; LaBERT and ``*-len`` models) asks for a short
        (1) or a detailed (4, 4-level plan) caption. Without one, a length-controllable model decodes at the level
        in :attr:`decode_cfg` (for a bundle: the default recorded at export, ``DEFAULT_LENGTH_LEVEL`` = 2)."""
        return cast(str, self.batch([image], length_level=length_level)[0])  # errors="raise": never None

    def batch(
        self, images: Any, batch_size: int = 16, length_level: int | None = None, errors: str = "raise"
    ) -> list[str | None]:
        """Captions for ``images`` (paths, PIL images or arrays; one H×W×3 array is one image), in order.

        ``errors``: ``"raise"`` (default) stops at the first image that cannot be loaded or preprocessed
        (:class:`edgecap.runtime.images.load.ImageError`: a missing, truncated or non-image file, ...); ``"skip"`` puts
        ``None`` in that image's slot, captions the others, and reports each skipped image with a
        :class:`SkippedImageWarning` (``warnings.warn``; its ``index``, ``image`` and ``error`` say which and why).

        Safe to call from several threads at once: each call decodes with its own state, and the runtimes'
        sessions are thread-safe.
        """
        if self.inputs is None:
            raise CaptionerError(self._no_images_reason or "this captioner cannot take images")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise CaptionerError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if errors not in ("raise", "skip"):
            raise CaptionerError(f"errors must be 'raise' or 'skip', got {errors!r}")
        images = _as_image_list(images)
        if errors == "skip":
            return self._batch_skipping(images, batch_size, length_level)
        out: list[str | None] = []
        for start in range(0, len(images), batch_size):
            batch = self.inputs(images[start : start + batch_size])
            out.extend(self.caption_inputs(batch, length_level=length_level))
        return out

    def _batch_skipping(self, images: list[Any], batch_size: int, length_level: int | None) -> list[str | None]:
        import warnings

        from edgecap.runtime.images.load import ImageError, load_image

        if length_level is not None:  # a bad level is the caller's error, not an image's: raise it before any work
            _check_length_level(self.step_model, length_level, self.length_levels)
        out: list[str | None] = [None] * len(images)
        good: list[tuple[int, Any]] = []

        def skip(index: int, image: Any, exc: ImageError) -> None:
            warnings.warn(SkippedImageWarning(index, image, exc), stacklevel=4)

        for i, image in enumerate(images):
            try:
                good.append((i, load_image(image)))  # decoded once here; preprocessing takes the RGB image as is
            except ImageError as exc:
                skip(i, image, exc)
        for start in range(0, len(good), batch_size):
            chunk = good[start : start + batch_size]
            try:
                inputs = self.inputs([image for _, image in chunk])
            except ImageError:  # one of them fails in preprocessing: find it, keep the rest
                kept = []
                for i, image in chunk:
                    try:
                        self.inputs([image])
                        kept.append((i, image))
                    except ImageError as exc:
                        skip(i, images[i], exc)
                chunk = kept
                if not chunk:
                    continue
                inputs = self.inputs([image for _, image in chunk])
            for (i, _), text in zip(chunk, self.caption_inputs(inputs, length_level=length_level), strict=True):
                out[i] = text
        return out

    def caption_inputs(self, inputs: Mapping[str, Any], length_level: int | None = None) -> list[str]:
        """Captions for one batch of precomputed encoder inputs (``features``/``boxes``/``feature_mask`` or
        ``pixel_values``, batch first; numpy arrays, or the runtime's own arrays), e.g. bottom-up region
        features."""
        from edgecap.runtime.captioning import captions_from_hypotheses
        from edgecap.runtime.decoding import decode

        cfg = self.decode_cfg
        if length_level is not None:
            _check_length_level(self.step_model, length_level, self.length_levels)
            cfg = cfg.replace(length_level=length_level)
        arrays = {k: v if hasattr(v, "shape") else np.asarray(v) for k, v in inputs.items()}
        return captions_from_hypotheses(self.vocab, decode(self.step_model, arrays, cfg))

    def stream(
        self,
        source: Any,
        *,
        every: float | None = None,
        fps: float | None = None,
        on_change: float | None = None,
        max_batch: int = 8,
        queue: int = 16,
        length_level: int | None = None,
    ) -> CaptionStream:
        """Caption a video file, a camera, an RTSP/HTTP stream or an image folder as it plays (``docs/streams.md``):
        ``for event in cap.stream("clip.mp4", every=0.5): print(event.pts_s, event.caption)``.

        Args:
            source: a path, URL, camera (``/dev/video0`` or an index), GStreamer pipeline or folder
                (:func:`edgecap.runtime.stream.sources.open_source`), or an opened ``FrameSource``.
            every: sample one frame every ``every`` seconds of the stream's own timestamps; or
            fps: sample at this rate. Neither: every frame.
            on_change: caption a sample only when its pooled backbone embedding moved at least this cosine distance
                from the last captioned sample's.
            max_batch: samples per decode call, at most (a caption does not depend on its batch).
            queue: samples waiting for the captioner, at most; a live source drops the oldest beyond it.
            length_level: as in :meth:`batch`.

        Returns the stream's :class:`~edgecap.runtime.stream.events.StreamEvent` (one per caption), as a
        :class:`~edgecap.runtime.stream.pipeline.CaptionStream`: its ``summary`` is set once it ends or is closed.
        Video sources need the ``[stream]`` extra (PyAV).
        """
        from edgecap.runtime.stream.pipeline import open_stream

        return open_stream(
            self, source, every=every, fps=fps, on_change=on_change, max_batch=max_batch, queue=queue,
            length_level=length_level,
        )  # fmt: skip

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Release runtime sessions (the captioner cannot be used afterwards)."""
        while self._resources:
            self._resources.pop().__exit__(None, None, None)

    def __enter__(self) -> Captioner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Captioner({self.runtime_info.get('summary') or self.runtime_info})"


def bundle_decode_cfg(bundle: Any, vocab: Any, beam: int, length_level: int | None = None) -> Any:
    """The production ``DecodeCfg`` of a bundle: its decoding (beam search, or mask-predict for LaBERT) at
    ``length_level``, default the level recorded at export for length-controllable bundles (``cap(image)`` then
    needs no level)."""
    from edgecap.runtime.captioning import decode_cfg_for

    overrides: dict[str, Any] = {}
    if bundle.decoding == "mask_predict":
        overrides["strategy"] = "mask_predict"
    level = length_level if length_level is not None else bundle.default_length_level
    if level is not None:
        overrides["length_level"] = int(level)
    return decode_cfg_for(vocab, beam_size=beam, max_words=bundle.max_words, **overrides)


def _check_beam(beam: Any) -> None:
    from edgecap.runtime.decoding.config import MAX_BEAM

    if isinstance(beam, bool) or not isinstance(beam, int) or not 1 <= beam <= MAX_BEAM:
        raise CaptionerError(f"beam must be an integer in 1..{MAX_BEAM} (MAX_BEAM), got {beam!r}")


#: What ``Captioner.load``/``from_run`` and ``edgecap caption`` say when a beam is asked of a mask-predict model.
NO_BEAM_SEARCH = (
    "this model decodes by mask-predict (LaBERT): it refines one caption in place, so a beam does not apply; leave "
    "beam unset (--beam off) and choose the caption's length with length_level (--length-level)"
)


def check_beam_applies(beam: int | None, decoding: str | None) -> None:
    """Refuse an explicit beam above 1 for a model that does not search (mask-predict), instead of ignoring it."""
    if decoding == "mask_predict" and beam is not None and beam != 1:
        raise CaptionerError(f"beam={beam}: {NO_BEAM_SEARCH}")


def _check_length_level(decoder: Any, level: Any, known: Sequence[tuple[int, int]] = ()) -> None:
    """A clear error for a level out of range, or for a model without length control (LaBERT §3.1)."""
    from edgecap.runtime.length import NO_LENGTH_CONTROL, LengthLevelError, check_level

    levels = getattr(decoder, "length_levels", None) or known or None
    if levels is None:
        levels = getattr(getattr(decoder, "model", None), "length_levels", None)
    if levels is None and "length_level" not in _encoder_inputs(decoder):
        raise LengthLevelError(NO_LENGTH_CONTROL)
    if levels:
        check_level(tuple(levels), level)


def _encoder_inputs(decoder: Any) -> tuple[str, ...]:
    encoder = getattr(decoder, "encoder", None)
    try:
        return tuple(encoder.input_metadata()) if encoder is not None else ()
    except Exception:  # an inactive runtime: nothing to learn from it
        return ()


def _as_image_list(images: Any) -> list[Any]:
    """One image (a path, encoded bytes, a PIL image or an H×W×C / H×W array) or a sequence of them -> a list of images.

    A single array is one image, not a sequence of rows; a 4-D array is a batch of images along axis 0.
    """
    if isinstance(images, (str, os.PathLike, bytes, bytearray, memoryview)):  # one path, or one encoded image
        return [images]
    if isinstance(images, np.ndarray):
        if images.ndim in (2, 3):
            return [images]
        if images.ndim == 4:
            return list(images)
        raise CaptionerError(f"an image array must be H×W, H×W×C or N×H×W×C, got shape {images.shape}")
    if hasattr(images, "getbands"):  # a PIL image
        return [images]
    return list(images)


def _describe(info: Mapping[str, Any]) -> str:
    where = ", ".join(info["providers"]) if info.get("providers") else info.get("device", "cpu")
    if info.get("decoding") == "mask_predict":
        search = f"mask-predict at length level {info.get('length_level')}"
    else:
        level = info.get("length_level")
        search = f"beam {info.get('beam')}" + (f" at length level {level}" if level is not None else "")
    threads = info.get("threads")
    threading = f", {_threads_text(threads)}" if threads else ""
    return (
        f"{info.get('model')} on {info['runtime']} [{where}{threading}] at {info['precision']} "
        f"({info.get('precision_reason')}), {search}, backbone {info.get('backbone')}"
    )


def _threads_text(threads: Mapping[str, Any]) -> str:
    from edgecap.runtime.backends.threads import ThreadPlan

    return ThreadPlan.from_dict(threads).describe()
