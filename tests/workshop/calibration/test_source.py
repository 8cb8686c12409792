"""CalibrationSource and its ONNX Runtime adapter: order, generators, the cache; no TensorRT calibrator remains."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from edgecap.workshop.export.calibration import CalibrationError, CalibrationSource, OnnxRuntimeCalibrationReader


def feeds(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((2, 8)).astype(np.float32), "id": np.array([i], np.int64)} for i in range(count)]


def ids(source: CalibrationSource) -> list[int]:
    return [int(feed["id"][0]) for feed in source]


# -- the source ------------------------------------------------------------------------------------------------------
def test_list_source_keeps_order_and_is_reiterable() -> None:
    source = CalibrationSource(feeds(5))
    assert ids(source) == [0, 1, 2, 3, 4]
    assert ids(source) == [0, 1, 2, 3, 4]  # a second pass
    assert len(source) == 5 and source.count == 5 and source.reiterable


def test_limit_and_torch_feeds() -> None:
    data = [{"x": torch.full((2, 3), float(i)), "id": torch.tensor([i])} for i in range(6)]
    source = CalibrationSource(data, limit=3)
    out = list(source)
    assert len(source) == 3 and [int(f["id"][0]) for f in out] == [0, 1, 2]
    assert all(isinstance(v, np.ndarray) for f in out for v in f.values())
    assert out[2]["x"].dtype == np.float32 and out[2]["x"][0, 0] == 2.0


def test_generator_is_accepted_once_and_materialize_keeps_it() -> None:
    source = CalibrationSource(f for f in feeds(4))
    assert not source.reiterable
    with pytest.raises(TypeError):
        len(source)  # unknown before the pass
    assert ids(source) == [0, 1, 2, 3] and len(source) == 4
    with pytest.raises(CalibrationError, match="one-shot"):
        list(source)

    kept = CalibrationSource((f for f in feeds(3)), cache="c.json").materialize()
    assert kept.reiterable and ids(kept) == ids(kept) == [0, 1, 2] and str(kept.cache) == "c.json"


def test_callable_source_gives_a_fresh_pass_each_time() -> None:
    calls = []

    def factory():
        calls.append(1)
        return (f for f in feeds(3))

    source = CalibrationSource(factory)
    assert ids(source) == ids(source) == [0, 1, 2] and len(calls) == 2


@pytest.mark.parametrize(
    ("data", "message"),
    [({"x": np.zeros(2)}, "single Mapping|single dict"), ("feeds", "single str"), (42, "iterable")],
)
def test_bad_data_is_rejected(data: object, message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        CalibrationSource(data)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("feed", "message"),
    [(np.zeros(3), "mapping"), ({}, "empty"), ({1: np.zeros(2)}, "non-string"), ({"x": "abc"}, "not an array")],
)
def test_bad_feeds_name_their_index(feed: object, message: str) -> None:
    with pytest.raises(CalibrationError, match=rf"feed #1.*{message}"):
        list(CalibrationSource([feeds(1)[0], feed]))


def test_cache_is_written_atomically_and_read_back(tmp_path) -> None:
    source = CalibrationSource(feeds(2), cache=tmp_path / "sub" / "calib.cache")
    assert not source.has_cache() and source.read_cache() is None
    source.write_cache(b"TRT-8601-EntropyCalibration2\nx: 3c010a14\n")
    assert source.has_cache() and source.read_cache().startswith(b"TRT-8601")
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["calib.cache"]  # no temporary files left behind
    (tmp_path / "dir.cache").mkdir()
    with pytest.raises(CalibrationError, match="not a file"):
        CalibrationSource(feeds(1), cache=tmp_path / "dir.cache").read_cache()


# -- ONNX Runtime reader ---------------------------------------------------------------------------------------------
def test_the_reader_serves_feeds_in_order_then_none() -> None:
    reader = OnnxRuntimeCalibrationReader(CalibrationSource(feeds(3)), ["x", "id"], {"x": np.float64})
    got = [reader.get_next() for _ in range(4)]
    assert [int(f["id"][0]) for f in got[:3]] == [0, 1, 2] and got[3] is None
    assert got[0]["x"].dtype == np.float64 and reader.served == 3 and len(reader) == 3


def test_the_reader_is_an_onnxruntime_calibration_data_reader() -> None:
    ortq = pytest.importorskip("onnxruntime.quantization")
    assert isinstance(OnnxRuntimeCalibrationReader(feeds(1)), ortq.CalibrationDataReader)


def test_the_reader_rejects_feeds_that_do_not_match_the_graph() -> None:
    reader = OnnxRuntimeCalibrationReader(feeds(2), ["x", "mask"])
    with pytest.raises(CalibrationError, match=r"feed #0.*missing \['mask'\], unexpected \['id'\]"):
        reader.get_next()


def test_the_reader_windows_for_strided_calibration() -> None:
    reader = OnnxRuntimeCalibrationReader(CalibrationSource(feeds(4)))
    windows = []
    for start in range(0, len(reader), 2):
        reader.set_range(start, start + 2)
        windows.append([int(f["id"][0]) for f in reader])
    assert windows == [[0, 1], [2, 3]]
    reader.set_range(1, 2)  # going back rewinds the (re-iterable) source
    assert [int(f["id"][0]) for f in reader] == [1]
    with pytest.raises(CalibrationError, match="past the last feed"):
        reader.set_range(9, 10)


def test_no_implicit_int8_calibrator_remains() -> None:
    import edgecap.workshop.export.calibration as calibration
    import edgecap.workshop.export.calibration.quantize as quantize

    for gone in ("TrtCalibrator", "write_trt_calibration_cache", "read_trt_calibration_cache"):
        assert not hasattr(calibration, gone) and not hasattr(quantize, gone), gone


def test_importing_calibration_loads_no_backend() -> None:
    code = (
        "import sys, edgecap.workshop.export.calibration as c; c.quantize_int8, c.compare_decoders; "
        "print(sorted(m for m in ('onnx', 'onnxruntime', 'tensorrt') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
