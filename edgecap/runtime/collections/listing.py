"""The image files of a collection, listed as a stream in one fixed order, so a run can resume by position.

A collection is what ``edgecap caption`` was given: image files and directories (the *sources*), in that order. Each
directory is walked with ``os.scandir``, its entries sorted by name (Python's ``str`` order) and each sub-directory
entered at its sorted place; no list of the whole collection is ever built: memory holds the image names of one
directory per level being walked (a sorted order needs them), so it grows with the largest directory, never with
the count.
A listed image is therefore ordered by its :func:`key`, ``(source index, path parts below the source)``, and the
walk yields the keys in increasing order. That is what makes resuming O(1) in memory: a journal written in listing
order ends at the last image done, and every key up to it (:meth:`Collection.after`) is done.

Directories yield the files whose suffix is in :data:`~edgecap.runtime.images.load.IMAGE_SUFFIXES` (any case; the
set ``edgecap bench --images`` and calibration folders use); a file named as a source is listed whatever its suffix
(the user asked for it). Symbolic links to files are listed; links to directories are not followed (a link cycle
would never end, and a second path to the same images would caption them twice). Hidden entries are walked like any
other, except the run's own output: the file (or folder) ``--out`` names and its temporary and lock files
(``.NAME.*``) beside it are never listed, whatever their suffix (:meth:`Collection.excluding`).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

from edgecap.runtime.images.load import IMAGE_SUFFIXES

__all__ = ["Collection", "CollectionError", "Key"]

#: Where a listed image stands in the listing: (source index, its path's parts below the source; ``()`` for a file
#: named as a source). Tuples compare part by part, which is the walk's order.
Key = tuple[int, tuple[str, ...]]


class CollectionError(ValueError):
    """Sources that cannot be listed as one collection: missing, overlapping, or not naming a path of theirs."""


def _is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES


def _walk(
    directory: str, parts: tuple[str, ...], recursive: bool, hidden: dict[tuple[str, ...], str]
) -> Iterator[tuple[str, ...]]:
    """The image files below ``directory``, as path parts relative to the source, in sorted-name order; ``hidden``:
    folder parts -> the output's name there (it and its ``.NAME.*`` files are not listed)."""
    files: list[str] = []
    dirs: list[str] = []
    output = hidden.get(parts)
    try:
        with os.scandir(directory) as scan:
            for entry in scan:  # the file type comes with the listing on Linux (no stat per file)
                if output is not None and (entry.name == output or entry.name.startswith(f".{output}.")):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    dirs.append(entry.name)
                elif _is_image_name(entry.name) and entry.is_file():
                    files.append(entry.name)
    except OSError as exc:
        raise CollectionError(f"cannot list {directory}: {exc.strerror or exc}") from exc
    # one directory's image names at a time (a sorted order needs them all): memory grows with the largest
    # directory, never with the collection
    files.sort()
    if recursive:
        dirs.sort()
    else:
        dirs.clear()
    for name, is_dir in heapq.merge(((n, False) for n in files), ((n, True) for n in dirs)):
        if is_dir:
            yield from _walk(os.path.join(directory, name), (*parts, name), recursive, hidden)
        else:
            yield (*parts, name)


@dataclass(frozen=True)
class Collection:
    """Sources (files and directories, in the order given) and whether directories are walked recursively."""

    sources: tuple[Path, ...]
    recursive: bool = False
    #: Where the run's output lies below directory sources: (source index, folder parts, name); never listed.
    outputs: tuple[tuple[int, tuple[str, ...], str], ...] = ()

    @classmethod
    def of(
        cls, sources: Sequence[str | os.PathLike], recursive: bool = False, output: str | os.PathLike | None = None
    ) -> Collection:
        """Check the sources before any work: each exists, none is given twice or lies inside a directory source
        (its images would be listed twice, and the order would no longer say which source a line came from); with
        ``output``, :meth:`excluding` it."""
        paths = tuple(Path(s) for s in sources)
        if not paths:
            raise CollectionError("no images or directories given")
        for path in paths:
            if not path.exists():
                raise CollectionError(f"no such file or directory: {path}")
        real = [Path(os.path.realpath(p)) for p in paths]
        for i, (a, ra) in enumerate(zip(paths, real, strict=True)):
            for b, rb in zip(paths[i + 1 :], real[i + 1 :], strict=True):
                for inner, outer, r_in, r_out in ((a, b, ra, rb), (b, a, rb, ra)):
                    # on disk, or by name alone (a linked folder's images are named as if inside the other)
                    within = r_in == r_out or r_out in r_in.parents or inner.parts[: len(outer.parts)] == outer.parts
                    if outer.is_dir() and within:
                        raise CollectionError(
                            f"{inner} is {'the same as' if r_in == r_out else 'inside'} {outer}: give each image "
                            "once (overlapping sources would caption images twice)"
                        )
        collection = cls(paths, recursive)
        return collection if output is None else collection.excluding(output)

    def excluding(self, output: str | os.PathLike) -> Collection:
        """This collection without the run's ``output`` (and its ``.NAME.*`` temporary files) in its listing.

        Raises:
            CollectionError: ``output`` is one of the sources (a file that would be both read and written, or a
                directory source).
        """
        out = Path(output)
        real = Path(os.path.realpath(out))
        hidden = list(self.outputs)
        for index, source in enumerate(self.sources):
            real_source = Path(os.path.realpath(source))
            same = real == real_source or (out.exists() and os.path.samefile(out, source))
            if same:
                what = "a directory given to caption" if source.is_dir() else "one of the images given"
                raise CollectionError(f"--out {out} is {what} ({source}): write the captions to another file")
            if source.is_dir() and real_source in real.parents:
                below = real.relative_to(real_source).parts
                hidden.append((index, below[:-1], below[-1]))
        return Collection(self.sources, self.recursive, tuple(hidden))

    def __iter__(self) -> Iterator[tuple[Key, str]]:
        """Every image of the collection as ``(key, path)``, keys increasing; the path is ``str(source / parts)``,
        exactly as written to the journal (a string: no ``Path`` per image)."""
        return self.after(None)

    def after(self, last: Key | None) -> Iterator[tuple[Key, str]]:
        """The images listed after ``last`` (all of them for None), without listing the sources before it."""
        for index, source in enumerate(self.sources):
            if last is not None and index < last[0]:
                continue
            hidden = {parts: name for i, parts, name in self.outputs if i == index}
            if not source.is_dir():
                if last is None or index > last[0]:
                    yield (index, ()), str(source)
                continue
            top = str(source)
            for parts in _walk(top, (), self.recursive, hidden):
                if last is None or (index, parts) > last:
                    yield (index, parts), os.path.join(top, *parts)

    def count(self, after: Key | None = None) -> int:
        """How many images :meth:`after` yields (one more walk, names only: the progress bar's total)."""
        return sum(1 for _ in self.after(after))

    def key(self, path: str) -> Key:
        """The key of a path this collection lists (the last line of a journal being resumed).

        Raises:
            CollectionError: no source lists ``path`` (the journal was written for other sources).
        """
        pure = PurePath(path)
        for index, source in enumerate(self.sources):
            if not source.is_dir():
                if pure == PurePath(source):
                    return index, ()
                continue
            try:
                parts = pure.relative_to(source).parts
            except ValueError:
                continue
            if parts and ".." not in parts and (self.recursive or len(parts) == 1):
                return index, parts
        shown = ", ".join(str(s) for s in self.sources[:3]) + (" …" if len(self.sources) > 3 else "")
        raise CollectionError(
            f"{path} is not an image of {shown}{' (recursively)' if self.recursive else ''}: resume with the same "
            "paths and --recursive choice the output was started with"
        )
