"""Split decodes (``edgecap.runtime.decoding.parallel``): a batch decoded as concurrent chunks of images gives the
hypotheses of one decode, each chunk in its own thread; what must not be split is not."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from edgecap.runtime.decoding import DecodeCfg, decode
from edgecap.runtime.decoding.arrays import to_numpy
from edgecap.runtime.decoding.parallel import decode_workers_of, in_decode_chunk, split_decode
from edgecap.runtime.decoding.processors import build_processors
from tests.runtime.decoding.fakes import RandomStepModel


class ChunkRecordingModel(RandomStepModel):
    """A random step model that may run ``workers`` decodes at once and records each ``encode`` call: its images,
    its thread, and whether that thread was decoding a chunk of a split batch."""

    def __init__(self, images: int, workers: int) -> None:
        super().__init__(images, vocab_size=9, seed=4)
        self.decode_workers = workers
        self.encoded: list[tuple[list[int], int, bool]] = []

    def encode(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        self.encoded.append((to_numpy(inputs["image"]).tolist(), threading.get_ident(), in_decode_chunk()))
        return super().encode(inputs)

    def threads(self) -> set[int]:
        return {thread for _, thread, _ in self.encoded}


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@pytest.mark.parametrize(("images", "workers"), [(1, 3), (5, 3), (20, 2), (4, 8)])
def test_a_split_batch_gives_the_hypotheses_of_one_decode(strategy: str, images: int, workers: int) -> None:
    cfg = DecodeCfg(strategy=strategy, beam_size=3, n_best=2, max_len=7)
    split, whole = ChunkRecordingModel(images, workers), RandomStepModel(images, vocab_size=9, seed=4)
    assert decode(split, split.inputs(), cfg) == decode(whole, whole.inputs(), cfg)
    chunks = min(workers, images)
    bounds = [images * i // chunks for i in range(chunks + 1)]
    encoded = sorted(split.encoded)
    expected = [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    assert [chunk for chunk, _, _ in encoded] == expected
    assert encoded[0][1] == threading.get_ident()  # the first chunk runs in the calling thread
    assert all(flag == (chunks > 1) for _, _, flag in encoded)
    assert not in_decode_chunk()


def test_sampling_caller_processors_and_one_worker_decode_in_one_call() -> None:
    model = ChunkRecordingModel(6, workers=3)
    cfg = DecodeCfg(strategy="sample", num_samples=2, seed=5, max_len=6)
    decode(model, model.inputs(), cfg)  # random draws follow the batch order: never split
    assert model.threads() == {threading.get_ident()} and len(model.encoded) == 1
    beam = DecodeCfg(strategy="beam", beam_size=2, max_len=6)
    model.encoded.clear()
    decode(model, model.inputs(), beam, processors=build_processors(beam))  # caller processors
    assert model.threads() == {threading.get_ident()} and len(model.encoded) == 1
    model.decode_workers = 1
    model.encoded.clear()
    decode(model, model.inputs(), beam)
    assert model.threads() == {threading.get_ident()} and len(model.encoded) == 1


def test_split_decode_keeps_image_order_and_the_chunk_flag() -> None:
    inputs = {"x": np.arange(7), "y": np.arange(7) * 10}
    seen: list[tuple[list[int], bool]] = []

    def one(chunk: Mapping[str, Any]) -> list[list[int]]:
        seen.append((chunk["x"].tolist(), in_decode_chunk()))
        assert (chunk["y"] == chunk["x"] * 10).all()
        return [[int(v)] for v in chunk["x"]]

    assert split_decode(one, inputs, 3) == [[v] for v in range(7)]
    assert sorted(seen) == [([0, 1], True), ([2, 3], True), ([4, 5, 6], True)]


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "2"])
def test_bad_decode_workers_are_refused(workers: Any) -> None:
    model = RandomStepModel(2, vocab_size=9)
    model.decode_workers = workers  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="decode_workers"):
        decode_workers_of(model)
