"""Caption a collection across machines on Ray Data: ``edgecap caption DIR --ray [ADDRESS] --out X.jsonl|X.parquet``.

Ray does the distribution (we write no scheduler): ``read_binary_files`` reads the image files in Ray tasks, a fixed
pool of actors maps :class:`_CaptionActor` over them, each actor loading one ``Captioner`` and decoding the bytes
with :func:`~edgecap.runtime.images.load.load_image` (the decode ``edgecap caption`` uses on paths, so captions are
the same). A bad image becomes an error record, never a failed task.

- ``X.jsonl``: the driver streams the rows into a :class:`~edgecap.runtime.collections.journal.Journal` in listing
  order (Ray keeps the order), so the file is line for line what ``edgecap caption --out X.jsonl`` writes, and
  ``resume`` skips what is written exactly as it does.
- ``X.parquet``: a directory of Parquet files (columns ``path``, ``caption``, ``error``) written by the Ray tasks,
  moved into place when complete.

The listing goes to Ray :data:`WINDOW` paths at a time, so the driver never holds the whole collection. Images, the
bundle and a Parquet ``--out`` are read and written by every node at the same absolute paths: shared storage.
``docs/ray.md`` is the user's page.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import socket
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.runtime.collections.journal import Journal, record_line
from edgecap.runtime.collections.listing import Collection
from edgecap.runtime.collections.resume import ResumePoint, repair, resume_point

__all__ = ["BATCH", "CONNECT_SECONDS", "ROWS_PER_CALL", "WINDOW", "actor_cpus", "caption_with_ray"]

#: Images per call on an actor (``map_batches``' batch): a call's hand-off costs nothing next to its captions.
ROWS_PER_CALL = 64
#: Images per decode call of ``Captioner.caption`` inside a call (the non-Ray path's batch).
BATCH = 16
#: Listed paths handed to Ray per dataset: what the driver holds at once, whatever the collection's size. Each window
#: starts the actor pool again (one model load per actor), which is seconds against the minutes a window takes.
WINDOW = 100_000

#: Seconds a cluster's address gets to take a TCP connection, checked before ``ray.init`` (which, for an address
#: where nothing answers, retries for minutes).
CONNECT_SECONDS = 10.0

_INSTALL = "pip install 'edgecap[ray]'"


class _Names:
    """The absolute paths Ray reads -> the paths as the listing names them (``source / parts``, as written).

    The deepest source holding a path is its source: sources never overlap, except through a linked directory inside
    a directory source, whose walk does not follow the link (so only the deeper source lists those files).
    """

    def __init__(self, files: dict[str, str], dirs: dict[str, str]) -> None:
        self.files, self.dirs = files, dirs

    @classmethod
    def of(cls, sources: Sequence[Path]) -> _Names:
        """Made where the sources were given (the driver): a relative source means the driver's working directory,
        not an actor's."""
        files = {os.path.abspath(s): str(s) for s in sources if not s.is_dir()}
        return cls(files, {os.path.abspath(s): str(s) for s in sources if s.is_dir()})

    def listed(self, absolute: str) -> str:
        if absolute in self.files:
            return self.files[absolute]
        head = absolute
        while (parent := os.path.dirname(head)) != head:
            head = parent
            if head in self.dirs:
                return str(Path(self.dirs[head]).joinpath(*Path(absolute).relative_to(head).parts))
        raise ValueError(f"{absolute} is not below any of the sources")


class _CaptionActor:
    """One actor of the pool: loads its ``Captioner`` once, then captions the ``{path, bytes}`` batches Ray sends.

    A count of ``threads`` is kept; a policy (``auto``, ``dedicated``) or ``0`` becomes the CPUs Ray reserved for
    this actor, because several actors may share a node and each would otherwise size its threads for all of it.
    """

    def __init__(
        self, bundle: str, load: dict[str, Any], length_level: int | None, names: tuple[dict[str, str], dict[str, str]]
    ) -> None:
        from edgecap.runtime.captioner import Captioner

        threads = load.get("threads")
        if not (isinstance(threads, int) and threads > 0):
            import ray

            reserved = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
            load = {**load, "threads": max(1, int(reserved))}
        self.captioner = Captioner.load(bundle, **load)
        self.captioner.check_options(length_level=length_level)  # a bad level fails here, not per image
        self.length_level = length_level
        self.names = _Names(*names)

    def __call__(self, batch: dict[str, np.ndarray]) -> Any:
        import pyarrow as pa

        from edgecap.runtime.captioner import SkippedImageWarning

        paths = [self.names.listed(str(p)) for p in batch["path"]]
        blobs = [bytes(b) for b in batch["bytes"]]
        with warnings.catch_warnings(record=True) as caught:  # one call at a time per actor: no other thread warns
            warnings.simplefilter("always", SkippedImageWarning)
            replies = self.captioner.caption(blobs, batch_size=BATCH, length_level=self.length_level, errors="skip")
        captions = [None if reply is None else reply.text for reply in replies]
        errors: list[str | None] = [None] * len(paths)
        for warning in caught:
            if isinstance(warning.message, SkippedImageWarning):
                i = warning.message.index
                errors[i] = _reason(str(warning.message.error), paths[i], len(blobs[i]))
            else:
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        for i, text in enumerate(captions):
            if text is None and errors[i] is None:
                errors[i] = f"{paths[i]}: not captioned"
        # one schema for every block (an all-caption block would otherwise type ``error`` as null in its file)
        return pa.table(
            {
                "path": pa.array(paths, pa.string()),
                "caption": pa.array(captions, pa.string()),
                "error": pa.array(errors, pa.string()),
            }
        )

    def __del__(self) -> None:
        captioner = getattr(self, "captioner", None)
        if captioner is not None:
            captioner.close()


def _reason(message: str, path: str, size: int) -> str:
    """An image error about the bytes (``<N encoded bytes>: ...``) named by its path, as ``edgecap caption`` has it."""
    if size == 0:  # load_image says "empty file" of a path, "empty" of bytes
        return f"{path}: empty file (0 bytes)"
    name = f"<{size} encoded bytes>"
    return path + message[len(name) :] if message.startswith(name) else f"{path}: {message}"


def actor_cpus(threads: int | str, workers: int, cluster_cpus: float) -> float:
    """The CPUs each of ``workers`` actors reserves: a thread count as given, else an equal share of the cluster
    (whole CPUs; a fraction when there are more actors than CPUs, which then take turns, each with one thread).

    Raises:
        ValueError: a thread count that the cluster cannot give every actor (they would wait forever).
    """
    if isinstance(threads, int) and threads > 0:
        if workers * threads > cluster_cpus:
            raise ValueError(
                f"{workers} worker(s) x {threads} thread(s) each need {workers * threads} CPUs; the Ray cluster has "
                f"{cluster_cpus:g}: lower --workers or --threads, or add nodes"
            )
        return float(threads)
    share = cluster_cpus / workers
    return float(int(share)) if share >= 1 else share


def _local_cpus() -> int:
    getaffinity = getattr(os, "sched_getaffinity", None)
    return len(getaffinity(0)) if getaffinity is not None else os.cpu_count() or 1


@contextlib.contextmanager
def _cluster(address: str | None) -> Iterator[Any]:
    """Ray, connected: to ``address``, else to ``RAY_ADDRESS``, else to a cluster ``ray start`` began on this machine,
    else to a new local cluster of this machine's CPUs. Disconnected at the end (a cluster this process started stops
    with it); a Ray already initialised in this process is used as it is."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    target = address or os.environ.get("RAY_ADDRESS")
    try:
        if target is not None:
            ray.init(address=target)
        else:
            try:
                ray.init(num_cpus=_local_cpus(), include_dashboard=False)
            except ValueError:  # Ray found a running local cluster, whose CPUs are set already: join it as it is
                ray.init(include_dashboard=False)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError or ValueError, depending on what failed
        where = f"the Ray cluster at {target}" if target else "a local Ray cluster"
        raise RuntimeError(f"cannot start or reach {where}: {_last_line(exc)}") from exc
    try:
        yield ray
    finally:
        ray.shutdown()


def check_reachable(address: str) -> None:
    """Refuse, within :data:`CONNECT_SECONDS`, a cluster address (``HOST:PORT`` or ``ray://HOST:PORT``) whose port
    takes no connection; ``auto`` and ``local`` are Ray's to find.

    Raises:
        ValueError: not an address.
        RuntimeError: nothing answers there.
    """
    if address in ("auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"Ray address {address!r}: give HOST:PORT (the head's port, 6379 by default), ray://HOST:PORT or auto"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS):
            pass
    except OSError as exc:
        why = f"no answer in {CONNECT_SECONDS:g} s" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise RuntimeError(
            f"cannot reach the Ray cluster at {address} ({why}): is `ray start --head` running there?"
        ) from None


def _last_line(exc: BaseException) -> str:
    """The original error of a Ray error (its text is the remote traceback; the last line names the exception)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    name, colon, message = lines[-1].partition(": ")
    return f"{name.rpartition('.')[2]}{colon}{message}" if colon and " " not in name else lines[-1]


@contextlib.contextmanager
def _job_errors(resumable: bool) -> Iterator[None]:
    """A failed Ray job (an actor that could not load the bundle, a model error) as one RuntimeError line."""
    import ray.exceptions

    try:
        yield
    except ray.exceptions.RayError as exc:
        after = "; the lines written are complete: --resume continues" if resumable else ""
        raise RuntimeError(f"the Ray job failed: {_last_line(exc)}{after}") from exc


def _windows(paths: Iterable[str], size: int) -> Iterator[list[str]]:
    listing = iter(paths)
    while window := list(itertools.islice(listing, size)):
        yield window


def _dataset(ray: Any, window: list[str], actor: dict[str, Any], workers: int, cpus: float) -> Any:
    """The captions of ``window`` as a Ray dataset (lazy): read in tasks, mapped by the actor pool."""
    files = ray.data.read_binary_files([os.path.abspath(p) for p in window], include_paths=True, num_cpus=0)
    # the reads reserve no CPU: they are I/O, and the actors reserve every CPU when each takes a share
    return files.map_batches(
        _CaptionActor,
        fn_constructor_kwargs=actor,
        compute=ray.data.ActorPoolStrategy(size=min(workers, -(-len(window) // ROWS_PER_CALL))),
        num_cpus=cpus,
        batch_size=ROWS_PER_CALL,
        batch_format="numpy",
    )


def _lines(batch: dict[str, np.ndarray]) -> bytes:
    """Journal lines of a batch; a column of nulls comes back from Ray as NaN floats, hence the ``str`` checks."""
    lines = []
    for path, caption, error in zip(batch["path"], batch["caption"], batch["error"], strict=True):
        if isinstance(caption, str):
            lines.append(record_line(str(path), caption))
        else:
            lines.append(record_line(str(path), error=error if isinstance(error, str) else "not captioned"))
    return b"".join(lines)


def caption_with_ray(
    roots: list[Path],
    out: Path,
    *,
    bundle: Path,
    address: str | None,
    recursive: bool,
    resume: bool,
    workers: int,
    runtime: str,
    precision: str,
    threads: int | str,
    beam: int | None,
    length_level: int | None,
) -> int:
    """Caption every image under ``roots`` into ``out`` (``.jsonl`` or ``.parquet``) with ``workers`` Ray actors;
    returns the lines (rows) written.

    ``address``: a running cluster (``HOST:6379``); None: the one ``RAY_ADDRESS`` names, else one ``ray start``
    began on this machine, else a new local cluster of this machine's CPUs. ``threads``: each actor's thread count
    and CPU reservation (a policy: an equal share of the cluster's CPUs). The output is checked (and a JSONL one
    locked) before Ray starts.

    Raises:
        ValueError: bad arguments, sources or bundle; ``out`` exists (without ``resume`` for JSONL), is busy or
            cannot be written; the actors need more CPUs than the cluster has.
        RuntimeError: Ray is not installed, the cluster cannot be reached, or the job failed (the JSONL lines
            written are complete: ``resume`` continues).
    """
    from edgecap.runtime.bundle.layout import describe_directory, find_bundle

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    out = Path(out)
    kind = out.suffix.lower()
    if kind not in (".jsonl", ".parquet"):
        raise ValueError(f"--out {out}: name a .jsonl file or a .parquet directory")
    if kind == ".parquet" and resume:
        raise ValueError("--resume continues a .jsonl output; a .parquet output is written whole")
    if importlib.util.find_spec("ray") is None:
        raise RuntimeError(f"--ray needs Ray Data: {_INSTALL}")
    found = find_bundle(bundle)
    if found is None:
        raise ValueError(describe_directory(bundle, "bundle"))
    collection = Collection.of(roots, recursive=recursive, output=out)
    target = address or os.environ.get("RAY_ADDRESS")
    if target is not None:  # before any output: an address where nothing answers fails in seconds
        check_reachable(target)
    names = _Names.of(collection.sources)
    job = _Job(
        address=address,
        workers=workers,
        threads=threads,
        actor={
            "bundle": os.path.abspath(found),
            "load": {"runtime": runtime, "precision": precision, "beam": beam, "threads": threads},
            "length_level": length_level,
            "names": (names.files, names.dirs),
        },
    )
    if kind == ".jsonl":
        return _to_jsonl(collection, out, resume, job)
    return _to_parquet(collection, out, job)


@dataclass(frozen=True)
class _Job:
    """Where the job runs and what each actor loads (its constructor's keyword arguments)."""

    address: str | None
    workers: int
    threads: int | str
    actor: dict[str, Any]

    def datasets(self, ray: Any, paths: Iterable[str]) -> Iterator[tuple[int, Any]]:
        """``(images, dataset)`` per :data:`WINDOW` of ``paths``: the captions of that window, lazily."""
        cpus = actor_cpus(self.threads, self.workers, float(ray.cluster_resources().get("CPU", 0.0)))
        for window in _windows(paths, WINDOW):
            yield len(window), _dataset(ray, window, self.actor, self.workers, cpus)


def _to_jsonl(collection: Collection, out: Path, resume: bool, job: _Job) -> int:
    with Journal.open(out, resume=resume) as journal:
        point = resume_point(journal, collection) if not journal.created else ResumePoint()
        if point.notice(out):
            print(point.notice(out), file=sys.stderr, flush=True)
        if not point.redo and next(iter(collection.after(point.last)), None) is None:  # all written: no cluster
            if point.damaged:
                repair(journal, collection, b"")
            return 0
        with _cluster(job.address) as ray, _job_errors(resumable=True):
            context = ray.data.DataContext.get_current()
            keep = context.execution_options.preserve_order
            context.execution_options.preserve_order = True  # listing order: what resume relies on
            try:
                if point.damaged or point.redo:  # the images damaged lines lost first, merged in at their places
                    held = [_lines(batch) for batch in _batches(job, ray, point.redo)]
                    repair(journal, collection, b"".join(held))
                for batch in _batches(job, ray, (str(path) for _, path in collection.after(point.last))):
                    journal.append(_lines(batch))
            finally:
                context.execution_options.preserve_order = keep
        return journal.lines_written + len(point.redo)


def _batches(job: _Job, ray: Any, paths: Iterable[str]) -> Iterator[dict[str, np.ndarray]]:
    for _, dataset in job.datasets(ray, paths):
        yield from dataset.iter_batches(batch_size=ROWS_PER_CALL, batch_format="numpy")


def _to_parquet(collection: Collection, out: Path, job: _Job) -> int:
    from edgecap.runtime._io import atomic_directory, check_output_location

    try:
        check_output_location(out, existing="refuse", what="--out")
    except FileExistsError:
        raise ValueError(f"--out {out} already exists: choose another (a .parquet output is written whole)") from None
    written = 0
    with atomic_directory(out) as tmp, _cluster(job.address) as ray, _job_errors(resumable=False):
        for images, dataset in job.datasets(ray, (str(path) for _, path in collection)):
            dataset.write_parquet(str(tmp))
            written += images  # one row per image: the actors never drop or add one
    return written
