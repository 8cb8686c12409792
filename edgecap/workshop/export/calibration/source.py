"""``CalibrationSource``: an iterable of feed dicts plus a cache path, and its ONNX Runtime adapter.

Modelled on Polygraphy's ``Calibrator(data_loader, cache)``: the source
says *what* to calibrate on and *where* the result is remembered; each backend reads it through a thin adapter.

- :class:`OnnxRuntimeCalibrationReader`: ONNX Runtime's ``CalibrationDataReader`` protocol (``get_next`` returning a
  feed or ``None``; ``__len__``/``set_range`` for strided calibration), checking every feed against the graph's inputs.
  The cache is ONNX Runtime's JSON tensor-range cache (``quantize_static(calibration_cache_path=...)``).

TensorRT needs no calibrator: it builds INT8 engines from the explicit QDQ graphs these ranges produce
(``edgecap engine``); TensorRT's implicit-INT8 calibrators were deprecated in 10.1 and removed in 11.

A source is re-iterable when built from a sequence, a re-iterable collection or a zero-argument callable returning
a fresh iterable; a generator (or any one-shot iterator) is accepted too, and a second pass over it raises instead
of silently yielding nothing (which would look like an empty calibration set).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.runtime._io import atomic_write_bytes

__all__ = [
    "CalibrationError",
    "CalibrationSource",
    "Feed",
    "OnnxRuntimeCalibrationReader",
    "as_feed",
    "check_feed_names",
]


#: One graph feed: input name -> array.
Feed = dict[str, np.ndarray]
FeedLike = Mapping[str, Any]


class CalibrationError(ValueError):
    """An unusable calibration set or cache: empty, feed names that do not match the graph, a wrong cache format."""


# -- feeds -----------------------------------------------------------------------------------------------------------
def _to_numpy(value: Any, where: str) -> np.ndarray:
    detach = getattr(value, "detach", None)
    if detach is not None:  # a torch tensor (possibly on a GPU)
        return detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (str, bytes)) or value is None:
        raise CalibrationError(f"{where} is not an array (got {type(value).__name__})")
    array = np.asarray(value)
    if array.dtype == object:
        raise CalibrationError(f"{where} is not a numeric array (got {type(value).__name__})")
    return array


def as_feed(feed: Any, where: str = "calibration feed") -> Feed:
    """``feed`` as ``{name: numpy array}``; torch tensors are moved to the CPU, other array-likes converted.

    Raises:
        CalibrationError: ``feed`` is not a mapping of string names to arrays, or is empty.
    """
    if not isinstance(feed, Mapping):
        raise CalibrationError(f"{where} must be a mapping of input names to arrays, got {type(feed).__name__}")
    if not feed:
        raise CalibrationError(f"{where} is empty (no inputs)")
    out: Feed = {}
    for name, value in feed.items():
        if not isinstance(name, str):
            raise CalibrationError(f"{where} has a non-string input name {name!r}")
        out[name] = _to_numpy(value, f"{where} input {name!r}")
    return out


def check_feed_names(feed: Mapping[str, Any], expected: Sequence[str], where: str) -> None:
    """Raise :class:`CalibrationError` unless ``feed`` has exactly the names ``expected`` (the graph inputs)."""
    missing = [n for n in expected if n not in feed]
    unexpected = [n for n in feed if n not in expected]
    if missing or unexpected:
        raise CalibrationError(
            f"{where}: names do not match the graph inputs; missing {missing}, unexpected {unexpected} "
            f"(graph inputs: {list(expected)})"
        )


# -- the source ------------------------------------------------------------------------------------------------------
class CalibrationSource:
    """Calibration feeds in a fixed order, plus where the calibration result is cached.

    Args:
        data: the feeds: a sequence or other re-iterable collection of mappings, a zero-argument callable returning
            a fresh iterable on each call, or a one-shot iterator/generator (one pass only). Each feed maps graph
            input names to arrays (numpy, torch or array-like).
        cache: a calibration cache file (ONNX Runtime's JSON tensor ranges for
            :func:`~edgecap.workshop.export.calibration.int8.quantize_graph`); when the file exists the consumer reuses
            it instead of calibrating again.
        limit: use at most this many feeds (``None``: all).
        name: for messages.

    Iterating yields ``{name: numpy array}`` dicts in ``data``'s order; :attr:`count` is the number of feeds the last
    complete pass yielded.
    """

    _data: Iterable[FeedLike] | Callable[[], Iterable[FeedLike]]

    def __init__(
        self,
        data: Iterable[FeedLike] | Callable[[], Iterable[FeedLike]],
        cache: str | Path | None = None,
        *,
        limit: int | None = None,
        name: str = "calibration",
    ) -> None:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise CalibrationError(f"{name}: limit must be an integer >= 0 or None, got {limit!r}")
        if isinstance(data, CalibrationSource):
            data = data._data
        if isinstance(data, (Mapping, str, bytes)):
            raise CalibrationError(
                f"{name}: data must be an iterable of feed dicts (or a callable returning one), "
                f"got a single {type(data).__name__}; wrap one feed in a list"
            )
        self._data = data
        self._factory: Callable[[], Iterable[FeedLike]] | None = None
        self._one_shot = False
        if callable(data) and not isinstance(data, Iterable):
            self._factory = data
        elif isinstance(data, Iterator):  # generators and other one-shot iterators
            self._one_shot = True
        elif not isinstance(data, Iterable):
            raise CalibrationError(f"{name}: data must be iterable or a callable, got {type(data).__name__}")
        self.cache = Path(cache) if cache is not None else None
        self.limit = limit
        self.name = name
        self.count: int | None = None
        self._consumed = False

    # -- iteration ---------------------------------------------------------------------------------------------------
    @property
    def reiterable(self) -> bool:
        """Whether the feeds can be iterated more than once (false for generators)."""
        return not self._one_shot

    def __len__(self) -> int:
        """The number of feeds, when known without iterating (sequences, or after one complete pass)."""
        if isinstance(self._data, Sequence):
            return len(self._data) if self.limit is None else min(len(self._data), self.limit)
        if self.count is not None:
            return self.count
        raise TypeError(f"{self.name}: the number of feeds is unknown until the source has been iterated once")

    def length_hint(self) -> int | None:
        """The number of feeds if known without iterating, else None."""
        try:
            return len(self)
        except TypeError:
            return None

    def _raw(self) -> Iterable[FeedLike]:
        if self._factory is not None:
            produced = self._factory()
            if isinstance(produced, (Mapping, str, bytes)) or not isinstance(produced, Iterable):
                raise CalibrationError(
                    f"{self.name}: the data callable must return an iterable of feeds, got {type(produced).__name__}"
                )
            return produced
        if self._one_shot:
            if self._consumed:
                raise CalibrationError(
                    f"{self.name}: the feeds came from a one-shot iterator (e.g. a generator) that was already "
                    "consumed; pass a list, a re-iterable collection or a callable returning a fresh iterable, "
                    "or call materialize() first"
                )
            self._consumed = True
        return self._data  # type: ignore[return-value]

    def __iter__(self) -> Iterator[Feed]:
        count = 0
        for index, feed in enumerate(self._raw()):
            if self.limit is not None and index >= self.limit:
                break
            yield as_feed(feed, f"{self.name} feed #{index}")
            count += 1
        self.count = count

    def materialize(self) -> CalibrationSource:
        """A list-backed copy (same cache, name and limit applied), e.g. to iterate a generator more than once."""
        return CalibrationSource(list(self), self.cache, name=self.name)

    # -- cache -------------------------------------------------------------------------------------------------------
    def has_cache(self) -> bool:
        """Whether a cache path is set and the file exists."""
        return self.cache is not None and self.cache.is_file()

    def read_cache(self) -> bytes | None:
        """The cache file's bytes, or None when there is no cache path or no file yet."""
        if self.cache is None:
            return None
        if self.cache.exists() and not self.cache.is_file():
            raise CalibrationError(f"{self.name}: calibration cache {self.cache} is not a file")
        return self.cache.read_bytes() if self.cache.is_file() else None

    def write_cache(self, data: bytes) -> None:
        """Write the cache atomically (no-op when no cache path is set)."""
        if self.cache is not None:
            atomic_write_bytes(self.cache, bytes(data))

    def __repr__(self) -> str:
        kind = "callable" if self._factory is not None else "one-shot" if self._one_shot else type(self._data).__name__
        return f"CalibrationSource(name={self.name!r}, data={kind}, cache={str(self.cache) if self.cache else None})"


def as_source(data: Any, name: str = "calibration") -> CalibrationSource:
    """``data`` if it already is a :class:`CalibrationSource`, else a new source over it."""
    return data if isinstance(data, CalibrationSource) else CalibrationSource(data, name=name)


# -- ONNX Runtime adapter --------------------------------------------------------------------------------------------
class OnnxRuntimeCalibrationReader:
    """ONNX Runtime's ``CalibrationDataReader`` over a :class:`CalibrationSource`.

    It does not inherit from ``onnxruntime.quantization.CalibrationDataReader`` (so this module imports without
    onnxruntime) but satisfies its protocol — the ABC's ``__subclasshook__`` accepts any class with ``get_next``,
    so ``isinstance(reader, CalibrationDataReader)`` is true.

    Args:
        source: the feeds.
        input_names: the graph's inputs; every feed must have exactly these names (else :class:`CalibrationError`).
        dtypes: input name -> the dtype the graph declares; feeds are cast to it (e.g. float64 features, int32
            tokens), so the same recorded feeds serve graphs that differ only in input dtypes.
        length: the number of feeds when known (enables ``__len__``/``set_range``, i.e. strided calibration).
        on_feed: called after each feed is served (progress bars).
    """

    def __init__(
        self,
        source: CalibrationSource | Iterable[FeedLike],
        input_names: Sequence[str] | None = None,
        dtypes: Mapping[str, Any] | None = None,
        *,
        length: int | None = None,
        on_feed: Callable[[], None] | None = None,
    ) -> None:
        self.source = as_source(source)
        self.input_names = tuple(input_names) if input_names is not None else None
        self.dtypes = {k: np.dtype(v) for k, v in (dtypes or {}).items()}
        self._length = length if length is not None else self.source.length_hint()
        self._on_feed = on_feed
        self._iterator: Iterator[Feed] | None = None
        self._position = 0
        self._stop: int | None = None
        self.served = 0

    def _prepare(self, feed: Feed, index: int) -> Feed:
        where = f"{self.source.name} feed #{index}"
        if self.input_names is not None:
            check_feed_names(feed, self.input_names, where)
        for name, dtype in self.dtypes.items():
            if name in feed and feed[name].dtype != dtype:
                feed[name] = feed[name].astype(dtype)
        return feed

    def _advance(self) -> Feed | None:
        if self._iterator is None:
            self._iterator = iter(self.source)
        feed = next(self._iterator, None)
        if feed is not None:
            feed = self._prepare(feed, self._position)
            self._position += 1
        return feed

    def get_next(self) -> Feed | None:
        """The next feed, or None when the source (or the window set by :meth:`set_range`) is exhausted."""
        if self._stop is not None and self._position >= self._stop:
            return None
        feed = self._advance()
        if feed is not None:
            self.served += 1
            if self._on_feed is not None:
                self._on_feed()
        return feed

    def __iter__(self) -> Iterator[Feed]:
        return self

    def __next__(self) -> Feed:
        feed = self.get_next()
        if feed is None:
            raise StopIteration
        return feed

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError(f"{self.source.name}: the number of feeds is unknown (pass length=)")
        return self._length

    def set_range(self, start_index: int, end_index: int) -> None:
        """Serve feeds ``[start_index, end_index)`` next (ONNX Runtime's strided calibration calls this in order)."""
        if start_index < self._position:
            self.rewind()
        self._stop = None
        while self._position < start_index:
            if self._advance() is None:
                raise CalibrationError(f"{self.source.name}: set_range({start_index}, ...) is past the last feed")
        self._stop = end_index

    def rewind(self) -> None:
        """Start again from the first feed (the source must be re-iterable)."""
        self._iterator, self._position, self._stop = None, 0, None
