"""``edgecap stream``: caption a video file, a camera, an RTSP/HTTP stream or an image folder as it plays."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from edgecap.cli.options import FiniteFloat, beam_option, fail, onnxruntime_threads_options, runtime_precision_options

if TYPE_CHECKING:
    from edgecap.runtime.stream.events import StreamEvent
    from edgecap.runtime.stream.pipeline import CaptionStream

#: Exit status after Ctrl-C (the shell's 128 + SIGINT), once the outputs are closed and the summary printed.
INTERRUPTED = 130

_POSITIVE = FiniteFloat(min=0, min_open=True)


@click.command("stream")
@click.argument("source")
@click.option(
    "--model",
    default="acort-xsmall",
    show_default=True,
    help="A bundle directory (`edgecap export`, pixels in) or the name of a model exported earlier "
    "($EDGECAP_HOME/bundles/NAME).",
)
@click.option(
    "--every",
    type=_POSITIVE,
    default=None,
    metavar="SECONDS",
    help="Caption one frame every SECONDS of the stream's own timestamps.",
)
@click.option(
    "--fps",
    type=_POSITIVE,
    default=None,
    metavar="F",
    help="Caption this many frames per second of stream (instead of --every).",
)
@click.option(
    "--on-change",
    type=FiniteFloat(0, 2),
    default=None,
    metavar="THRESHOLD",
    help="Caption a sampled frame only when its pooled backbone embedding moved at least THRESHOLD (cosine distance) "
    "from the last captioned frame's (docs/streams.md calibrates it).",
)
@click.option(
    "--max-batch",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Queued samples captioned per decode call, at most.",
)
@click.option(
    "--queue",
    "queue_size",
    type=click.IntRange(1),
    default=16,
    show_default=True,
    help="Samples waiting for the captioner, at most; a live source drops the oldest beyond it (files never drop).",
)
@click.option(
    "--vtt",
    type=click.Path(path_type=Path),
    default=None,
    help="Write WebVTT subtitles (a cue per caption, until the next).",
)
@click.option("--srt", type=click.Path(path_type=Path), default=None, help="Write SRT subtitles.")
@click.option(
    "--jsonl",
    type=click.Path(path_type=Path),
    default=None,
    help="Write one JSON line per caption: timestamp, frame index, caption, skipped/dropped counts, latency per stage.",
)
@click.option(
    "--live/--no-live",
    default=None,
    help="Treat SOURCE as live (drop the oldest queued sample when behind) or not (never drop: the reader waits) "
    "[default: cameras and URLs live, files and folders not].",
)
@click.option(
    "--fps-of-sequence",
    type=_POSITIVE,
    metavar="F",
    default=1.0,
    show_default=True,
    help="An image folder's or glob's frame rate: image i is at i / F seconds.",
)
@click.option(
    "--timeout",
    type=_POSITIVE,
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="A camera or URL that does not open, or stops sending frames, for this long is an error.",
)
@click.option("--overwrite", is_flag=True, help="Replace existing --vtt/--srt/--jsonl files (refused otherwise).")
@beam_option
@runtime_precision_options()
@click.option(
    "--length-level", type=click.IntRange(1), default=None, help="Caption length level (LaBERT and *-len models)."
)
@onnxruntime_threads_options()
def stream(
    source: str,
    model: str,
    every: float | None,
    fps: float | None,
    on_change: float | None,
    max_batch: int,
    queue_size: int,
    vtt: Path | None,
    srt: Path | None,
    jsonl: Path | None,
    live: bool | None,
    fps_of_sequence: float,
    timeout: float,
    overwrite: bool,
    beam: int,
    runtime: str,
    precision: str,
    length_level: int | None,
    threads: int | str,
    spin: bool | None,
) -> None:
    """Caption SOURCE as it plays: a video file (any format FFmpeg reads), an rtsp:// or http(s):// URL, a V4L2
    camera (/dev/video0 or an index), a GStreamer pipeline (contains "!") or an image folder or glob.

    Captions go to stdout as they come ("TIMESTAMP  CAPTION"), the summary to stderr at the end. A file never drops
    a sample; a live source drops the oldest queued sample when the captioner falls behind, and counts it. Ctrl-C
    ends with valid output files and the summary (exit status 130); a source error after good frames writes their
    captions, then reports it (exit status 1). Needs the [stream] extra (PyAV) for video sources (docs/streams.md).

    \b
    edgecap stream clip.mp4 --every 0.5 --vtt clip.vtt
    edgecap stream rtsp://camera/stream --every 1 --on-change 0.05 --jsonl captions.jsonl
    """
    from click.core import ParameterSource

    if every is not None and fps is not None:
        fail("--every and --fps both choose the sampling: pass one")
    outputs = {"--vtt": vtt, "--srt": srt, "--jsonl": jsonl}
    check_outputs(outputs, overwrite=overwrite, source=source)
    asked_beam = None if click.get_current_context().get_parameter_source("beam") == ParameterSource.DEFAULT else beam
    load = {"runtime": runtime, "precision": precision, "beam": asked_beam, "threads": threads, "spin": spin}
    sampling = {"every": every, "fps": fps, "on_change": on_change, "max_batch": max_batch, "queue": queue_size}
    opening = {"live": live, "sequence_fps": fps_of_sequence, "timeout_s": timeout}
    code = run_stream(source, opening, model, load, sampling, outputs, length_level=length_level)
    if code:
        sys.exit(code)


def check_outputs(outputs: dict[str, Path | None], *, overwrite: bool, source: str | None = None) -> None:
    """Refuse, before any work, an output that exists (without --overwrite), that is a directory, that is the source
    or one of its images (--overwrite would destroy the recording being captioned), that two flags share or nest,
    or whose directory cannot be written."""
    from edgecap.runtime._io import check_output_location

    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        resolved = path.resolve()
        for other, other_flag in seen.items():
            if _same_file(resolved, other):
                fail(f"{flag} and {other_flag} name the same file {path}")
            if other in resolved.parents or resolved in other.parents:
                fail(f"{flag} {path} and {other_flag} {other} lie one inside the other")
        seen[resolved] = flag
        if source is not None and _in_source(resolved, source):
            fail(f"{flag}: {path} is the source {source} (or one of its images); write the captions elsewhere")
        if path.is_dir():
            fail(f"{flag}: {path} is a directory")
        if path.exists() and not overwrite:
            fail(f"{flag}: {path} already exists; pass --overwrite to replace it")
        try:
            check_output_location(resolved.parent, existing="into", what=flag, reserve=0)
        except (ValueError, OSError) as exc:
            fail(str(exc))


def _same_file(a: Path, b: Path) -> bool:
    """The same path, or two names of one file (a hard link)."""
    if a == b:
        return True
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False


def _in_source(output: Path, source: str) -> bool:
    """Whether ``output`` (resolved) is the file ``source`` reads, or an image of the folder or glob it reads (or
    one it would read on the next run). URLs, cameras' indices and pipelines are no file of ours."""
    import fnmatch
    import glob
    import os

    from edgecap.runtime.stream.sources import IMAGE_SUFFIXES

    text = source[len("file://") :] if source.startswith("file://") else source
    if "://" in text or source.isdigit():
        return False
    spec = Path(text).resolve()
    if _same_file(output, spec) or spec in output.parents:  # the file itself, or the folder (or below it)
        return not spec.is_dir() or (output.parent == spec and output.suffix.lower() in IMAGE_SUFFIXES)
    if glob.has_magic(text) and not Path(text).exists():
        pattern = Path(text)
        if not glob.has_magic(str(pattern.parent)):  # the folder's real path, as ``output``'s is
            text = str(pattern.parent.resolve() / pattern.name)
        matches = (Path(m).resolve() for m in glob.glob(text))
        return fnmatch.fnmatch(str(output), os.path.abspath(text)) or any(_same_file(output, m) for m in matches)
    return False


def run_stream(
    source: str,
    opening: dict[str, Any],
    model: str,
    load: dict[str, Any],
    sampling: dict[str, Any],
    outputs: dict[str, Path | None],
    *,
    length_level: int | None,
) -> int:
    """Open the source, load the bundle, caption the stream into the outputs; the exit status."""
    import warnings

    from edgecap.runtime.backends.onnxruntime.fallback import ProviderFallback, ProviderFallbackWarning
    from edgecap.runtime.backends.registry import CaptionerError
    from edgecap.runtime.bundle.layout import find_bundle
    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.stream.sources import StreamSourceError, open_source

    bundle = find_bundle(model)
    if bundle is None:
        fail(f"no bundle found for {model!r} (a bundle directory, or $EDGECAP_HOME/bundles/{model})")
    try:
        opened = open_source(_source_spec(source), **opening)  # a missing camera or a dead URL: before the model
    except StreamSourceError as exc:
        fail(str(exc))
    try:
        with warnings.catch_warnings():  # said once below, from runtime_info
            warnings.simplefilter("ignore", ProviderFallbackWarning)
            captioner = Captioner.load(bundle, **load)
    except (ValueError, FileNotFoundError, RuntimeError, ImportError) as exc:  # a bad bundle or runtime request
        opened.close()
        fail(str(exc))
    except BaseException:
        opened.close()
        raise
    fallback = captioner.runtime_info.get("provider_fallback")
    if fallback:
        said = ProviderFallback(tuple(fallback["requested"]), tuple(fallback["in_use"]), fallback["cause"])
        click.echo(f"warning: ONNX Runtime is {said.describe()}", err=True)
    click.echo(f"runtime: {captioner.runtime_info['summary']}", err=True)
    with captioner:
        try:
            events = captioner.stream(opened, length_level=length_level, **sampling)
        except CaptionerError as exc:
            opened.close()
            fail(str(exc))
        every, fps = sampling["every"], sampling["fps"]
        return _caption_into(events, outputs, period_s=every if every else (1.0 / fps if fps else None))


def _source_spec(source: str) -> str | int:
    """A bare camera index ("0") is a camera; anything else is a path, URL or pipeline."""
    return int(source) if source.isdigit() else source


def _caption_into(events: CaptionStream, outputs: dict[str, Path | None], *, period_s: float | None) -> int:
    """Iterate ``events`` into the output files, the status line and stdout; close them whatever happens (each cue
    and line is already on disk as it is written). The exit status: 0, 1 after a source error, 130 after Ctrl-C."""
    from edgecap.runtime.stream.outputs import JsonlWriter, SrtWriter, StatusLine, WebVttWriter
    from edgecap.runtime.stream.sources import StreamSourceError

    writers: list[WebVttWriter | SrtWriter | JsonlWriter] = []
    try:
        for flag, path in outputs.items():
            if path is None:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if flag == "--jsonl":
                writers.append(JsonlWriter(path))
            else:  # the last cue runs to the stream's end, or one sample period when that is unknown
                writers.append((WebVttWriter if flag == "--vtt" else SrtWriter)(path, period_s=period_s))
    except OSError as exc:
        for writer in writers:
            writer.close()
        events.close()
        fail(f"cannot write {exc.filename}: {exc.strerror}")
    status = StatusLine()
    code, error = 0, None
    try:
        for event in events:
            for writer in writers:
                writer.write(event)
            status.clear()
            click.echo(f"{event.pts_s:10.3f}  {event.caption}")
            status.update(_status_text(event))
    except KeyboardInterrupt:
        code = INTERRUPTED
    except StreamSourceError as exc:  # after the good frames' captions: they are written
        code, error = 1, exc
    finally:
        events.close()
        status.clear()
        summary = events.summary
        for writer in writers:
            writer.close(None if summary is None else summary.end_s)
    if events.summary is not None:
        click.echo(events.summary.describe(), err=True)
    if error is not None:
        click.echo(f"error: {error}", err=True)
    return code


def _status_text(event: StreamEvent) -> str:
    total = event.latency_s.get("total", 0.0) * 1e3
    return f"t={event.pts_s:.2f}s frame {event.index}: {total:.0f} ms, {event.skipped} skipped, {event.dropped} dropped"
