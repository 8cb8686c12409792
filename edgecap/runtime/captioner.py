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
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from edgecap.runtime.backends.registry import CaptionerError
from edgecap.runtime.caption_plan import (
    BATCH,
    Key,
    SkippedImageWarning,
    as_image_list,
    batch_rows,
    check_call,
    per_image,
    plan,
    row_index,
    skipping_batches,
)
from edgecap.runtime.captioning import (
    NO_BEAM_SEARCH,
    Caption,
    bundle_decode_cfg,
    caption_of,
    check_beam,
    check_beam_applies,
    check_length_level,
    with_options,
)
from edgecap.runtime.images.inputs import BackboneMismatchError, PixelInputs
from edgecap.runtime.precisions import PRECISIONS

if TYPE_CHECKING:
    from edgecap.runtime.decoding import DecodeCfg, RefineModel, StepModel
    from edgecap.runtime.images.inputs import ImageInputs
    from edgecap.runtime.stream.pipeline import CaptionStream
    from edgecap.runtime.vocab_base import Vocabulary

log = logging.getLogger(__name__)


__all__ = [
    "NO_BEAM_SEARCH",
    "BackboneMismatchError",
    "Caption",
    "Captioner",
    "CaptionerError",
    "PixelInputs",
    "SkippedImageWarning",
    "bundle_decode_cfg",
    "check_beam_applies",
]

#: A per-call option: one value for every image, or one per image (None: the captioner's default).
Option = int | Sequence[int | None] | None


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
        inputs: ImageInputs | None,
        step_model: StepModel | RefineModel,
        vocab: Vocabulary,
        decode_cfg: DecodeCfg,
        *,
        runtime_info: Mapping[str, Any] | None = None,
        resources: Sequence[AbstractContextManager[object]] = (),
        no_images_reason: str = "",
        length_levels: Sequence[Sequence[int]] = (),
    ) -> None:
        self.inputs = inputs
        self.step_model = step_model
        self.vocab = vocab
        self.decode_cfg = decode_cfg
        self.runtime_info: dict[str, Any] = dict(runtime_info or {})
        self._resources = list(resources)
        #: why :meth:`caption` cannot take images, when ``inputs`` is None (only precomputed encoder inputs)
        self.no_images_reason = no_images_reason or "this captioner cannot take images"
        self.length_levels = tuple((int(lo), int(hi)) for lo, hi in length_levels)

    @property
    def backbone(self) -> object:
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
            check_beam(beam)  # before loading the run
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
        check_beam(beam)
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
    @overload
    def caption(
        self,
        images: Any,
        *,
        beam: Option = None,
        length_level: Option = None,
        batch_size: int | None = None,
        errors: Literal["raise"] = "raise",
    ) -> list[Caption]: ...

    @overload
    def caption(
        self,
        images: Any,
        *,
        beam: Option = None,
        length_level: Option = None,
        batch_size: int | None = None,
        errors: str,
    ) -> list[Caption | None]: ...

    def caption(
        self,
        images: Any,
        *,
        beam: Option = None,
        length_level: Option = None,
        batch_size: int | None = None,
        errors: str = "raise",
    ) -> list[Caption | None] | list[Caption]:
        """One :class:`~edgecap.runtime.captioning.Caption` (text, token ids, score) per image, in order: the call
        every front end decodes through (``cap(image)``, :meth:`batch`, serving, collections, streams, bench).

        Args:
            images: one image or a sequence of them (paths, encoded bytes, PIL images, H×W or H×W×C arrays; an
                N×H×W×C array is N images), as :func:`~edgecap.runtime.images.load.load_image` takes them; or one
                batch of prepared encoder inputs: a mapping of batch-first arrays (:meth:`prepare`, region
                features).
            beam: the beam width of this call (1 = greedy), or one per image (None in a slot: the default); default
                the captioner's (``Captioner.load(beam=...)``). A mask-predict model takes none above 1.
            length_level: the caption length level (1-based; LaBERT and ``*-len`` models), or one per image;
                default the captioner's.
            batch_size: images per decode call; default 16 for images, every row of prepared inputs. Images asking
                for different options decode in different calls; a caption never depends on which images share a
                call (``tests/test_captioner_batch_invariance.py``).
            errors: ``"raise"`` (default) stops at the first image that cannot be loaded or preprocessed
                (:class:`~edgecap.runtime.images.load.ImageError`); ``"skip"`` puts None in its slot and warns with
                a :class:`SkippedImageWarning`.

        Raises:
            CaptionerError: a beam, batch size or ``errors`` it cannot take; ``LengthLevelError``: a level out of
                range, or one asked of a model without length control. Both are ``ValueError``s, raised before any
                image is read (:meth:`check_options` checks options alone).
        """
        size = check_call(batch_size, errors)
        if isinstance(images, Mapping):  # prepared encoder inputs: rows, not images
            arrays = {k: v if hasattr(v, "shape") else np.asarray(v) for k, v in images.items()}
            rows = batch_rows(arrays)
            keys = self._options(beam, length_level, rows)
            out: list[Caption | None] = [None] * rows
            for key, chunk in plan(dict(enumerate(keys)), size or max(rows, 1)):
                part = arrays if len(chunk) == rows else {k: v[row_index(chunk)] for k, v in arrays.items()}
                self._decode_into(out, chunk, part, key)
            return out
        if self.inputs is None:
            raise CaptionerError(self.no_images_reason)
        listed = as_image_list(images)
        keys = self._options(beam, length_level, len(listed))
        out = [None] * len(listed)
        if errors == "skip":
            for key, chunk, inputs in skipping_batches(listed, keys, size or BATCH, self.inputs):
                self._decode_into(out, chunk, inputs, key)
            return out
        for key, chunk in plan(dict(enumerate(keys)), size or BATCH):
            self._decode_into(out, chunk, self.inputs([listed[i] for i in chunk]), key)
        return out

    def __call__(self, image: Any, length_level: int | None = None) -> str:
        """The caption of one image; ``length_level`` (1-based; LaBERT and ``*-len`` models) asks for a short
        (1) or a detailed (4, 4-level plan) caption. Without one, a length-controllable model decodes at the level
        in :attr:`decode_cfg` (for a bundle: the default recorded at export, ``DEFAULT_LENGTH_LEVEL`` = 2)."""
        return self.caption([image], length_level=length_level)[0].text

    def batch(
        self, images: Any, batch_size: int = BATCH, length_level: int | None = None, errors: str = "raise"
    ) -> list[str | None]:
        """Captions for ``images`` (paths, PIL images or arrays; one H×W×3 array is one image), in order: the text
        of :meth:`caption`'s replies.

        ``errors``: ``"raise"`` (default) stops at the first image that cannot be loaded or preprocessed
        (:class:`edgecap.runtime.images.load.ImageError`: a missing, truncated or non-image file, ...); ``"skip"`` puts
        ``None`` in that image's slot, captions the others, and reports each skipped image with a
        :class:`SkippedImageWarning` (``warnings.warn``; its ``index``, ``image`` and ``error`` say which and why).

        Safe to call from several threads at once: each call decodes with its own state, and the runtimes'
        sessions are thread-safe.
        """
        if self.inputs is None:
            raise CaptionerError(self.no_images_reason)
        if batch_size is None:
            raise CaptionerError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        replies = self.caption(images, batch_size=batch_size, length_level=length_level, errors=errors)
        return [None if reply is None else reply.text for reply in replies]

    def caption_inputs(self, inputs: Mapping[str, Any], length_level: int | None = None) -> list[str]:
        """Captions for one batch of precomputed encoder inputs (``features``/``boxes``/``feature_mask`` or
        ``pixel_values``, batch first; numpy arrays, or the runtime's own arrays), e.g. bottom-up region
        features: the text of :meth:`caption`'s replies."""
        if not isinstance(inputs, Mapping):
            raise CaptionerError(f"encoder inputs must be a mapping of arrays, got {type(inputs).__name__}")
        return [reply.text for reply in self.caption(inputs, length_level=length_level)]

    def prepare(self, images: Any) -> dict[str, np.ndarray]:
        """Images -> one batch of encoder inputs as host numpy arrays (batch first), which :meth:`caption` takes:
        for a front end that preprocesses before it captions (a stream's change gate looks at them; serving
        preprocesses each image alone, so a bad image fails alone)."""
        from edgecap.runtime.decoding.arrays import to_numpy

        if self.inputs is None:
            raise CaptionerError(self.no_images_reason)
        return {name: to_numpy(value) for name, value in self.inputs(as_image_list(images)).items()}

    def check_options(self, beam: object = None, length_level: object = None) -> None:
        """Refuse a beam or length level this captioner cannot decode at, with :meth:`caption`'s message: for a
        front end that checks a request before any work (serving). None passes.

        Raises:
            CaptionerError: ``beam`` is not an integer in ``1..MAX_BEAM``, or is above 1 for a mask-predict model.
            edgecap.runtime.length.LengthLevelError: ``length_level`` is out of the model's range, or the model has
                no length control.
        """
        if beam is not None:
            check_beam_applies(check_beam(beam), self.decode_cfg.strategy)
        if length_level is not None:
            check_length_level(self.step_model, length_level, self.length_levels)

    def _options(self, beam: Option, length_level: Option, count: int) -> list[Key]:
        """Each image's ``(beam, length_level)``, every distinct value checked before any work."""
        beams, levels = per_image("beam", beam, count), per_image("length_level", length_level, count)
        checked: list[Key] = []
        for key in zip(beams, levels, strict=True):
            if key not in checked:
                self.check_options(*key)
                checked.append(key)
        return list(zip(beams, levels, strict=True))

    def _decode_into(self, out: list[Caption | None], rows: list[int], inputs: Mapping[str, Any], key: Key) -> None:
        from edgecap.runtime.decoding import decode

        arrays = {k: v if hasattr(v, "shape") else np.asarray(v) for k, v in inputs.items()}
        hypotheses = decode(self.step_model, arrays, with_options(self.decode_cfg, *key))
        for i, hyps in zip(rows, hypotheses, strict=True):
            out[i] = caption_of(self.vocab, hyps[0])

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


def _threads_text(threads: Mapping[str, object]) -> str:
    from edgecap.runtime.backends.threads import ThreadPlan

    return ThreadPlan.from_dict(threads).describe()
