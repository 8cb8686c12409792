"""CalibrationSource and its ONNX Runtime / TensorRT adapters: order, generators, the cache, TensorRT tables."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from edgecap.calibration import CalibrationError, CalibrationSource, OrtCalibrationReader, TrtCalibrator
from edgecap.calibration.quantize import read_trt_calibration_cache, trt_version_code, write_trt_calibration_cache


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
def test_ort_reader_serves_feeds_in_order_then_none() -> None:
    reader = OrtCalibrationReader(CalibrationSource(feeds(3)), ["x", "id"], {"x": np.float64})
    got = [reader.get_next() for _ in range(4)]
    assert [int(f["id"][0]) for f in got[:3]] == [0, 1, 2] and got[3] is None
    assert got[0]["x"].dtype == np.float64 and reader.served == 3 and len(reader) == 3


def test_ort_reader_is_an_ort_calibration_data_reader() -> None:
    ortq = pytest.importorskip("onnxruntime.quantization")
    assert isinstance(OrtCalibrationReader(feeds(1)), ortq.CalibrationDataReader)


def test_ort_reader_rejects_feeds_that_do_not_match_the_graph() -> None:
    reader = OrtCalibrationReader(feeds(2), ["x", "mask"])
    with pytest.raises(CalibrationError, match=r"feed #0.*missing \['mask'\], unexpected \['id'\]"):
        reader.get_next()


def test_ort_reader_windows_for_strided_calibration() -> None:
    reader = OrtCalibrationReader(CalibrationSource(feeds(4)))
    windows = []
    for start in range(0, len(reader), 2):
        reader.set_range(start, start + 2)
        windows.append([int(f["id"][0]) for f in reader])
    assert windows == [[0, 1], [2, 3]]
    reader.set_range(1, 2)  # going back rewinds the (re-iterable) source
    assert [int(f["id"][0]) for f in reader] == [1]
    with pytest.raises(CalibrationError, match="past the last feed"):
        reader.set_range(9, 10)


# -- TensorRT --------------------------------------------------------------------------------------------------------
def test_trt_calibrator_serves_pointers_in_name_order_and_uses_the_cache(tmp_path) -> None:
    data = feeds(2)
    calibrator = TrtCalibrator(CalibrationSource(data, cache=tmp_path / "t.cache"), device="cpu")
    assert calibrator.read_calibration_cache() is None  # no table yet: TensorRT calibrates
    pointers = calibrator.get_batch(["id", "x"])
    buffers = calibrator._buffers
    assert pointers == [buffers["id"].data_ptr(), buffers["x"].data_ptr()]
    np.testing.assert_array_equal(buffers["x"].numpy(), data[0]["x"])
    assert calibrator.get_batch_size() == 1
    assert calibrator.get_batch(["id", "x"]) is not None and calibrator.get_batch(["id", "x"]) is None
    with pytest.raises(CalibrationError, match=r"asks for input\(s\) \['y'\]"):
        TrtCalibrator(feeds(1), device="cpu").get_batch(["y"])

    calibrator.write_calibration_cache(memoryview(b"TRT-100300-EntropyCalibration2\nx: 3c000000\n"))
    again = TrtCalibrator(CalibrationSource(data, cache=tmp_path / "t.cache"), device="cpu")
    assert again.read_calibration_cache().startswith(b"TRT-100300")  # reused: TensorRT skips calibration


def test_trt_calibrator_rejects_an_ort_range_cache(tmp_path) -> None:
    (tmp_path / "ranges.json").write_text(json.dumps({"data": {}, "calibration_method": "MinMax"}))
    calibrator = TrtCalibrator(CalibrationSource(feeds(1), cache=tmp_path / "ranges.json"), device="cpu")
    with pytest.raises(CalibrationError, match="not a TensorRT calibration table"):
        calibrator.read_calibration_cache()


def test_trt_calibrator_without_tensorrt_says_what_to_install() -> None:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="tensorrt"):
            TrtCalibrator(feeds(1)).as_tensorrt()
    else:
        pytest.skip("tensorrt is installed; covered by test_trt_calibrator_is_a_real_tensorrt_calibrator")


def test_trt_calibrator_is_a_real_tensorrt_calibrator() -> None:
    trt = pytest.importorskip("tensorrt", reason="TensorRT is not installed (no wheel installs without NVIDIA's index)")
    if not hasattr(trt, "IInt8EntropyCalibrator2"):
        with pytest.raises(CalibrationError, match="removed in TensorRT 11"):
            TrtCalibrator(feeds(1)).as_tensorrt()
        return
    wrapped = TrtCalibrator(feeds(1), device="cpu").as_tensorrt()
    assert isinstance(wrapped, trt.IInt8EntropyCalibrator2) and wrapped.get_batch_size() == 1


def test_trt_calibration_table_round_trip(tmp_path) -> None:
    ranges = {"memory": (-2.54, 1.0), "logits": (0.0, 12.7), "tokens_emb": (-0.5, 0.25)}
    write_trt_calibration_cache(ranges, tmp_path / "c.cache", trt_version="8.6.1")
    text = (tmp_path / "c.cache").read_text().splitlines()
    assert text[0] == "TRT-8601-EntropyCalibration2"
    # the scale is amax / 127 as float32 bits in hex: 12.7 / 127 = 0.1 -> 0x3dcccccd
    assert "logits: 3dcccccd" in text
    header, scales = read_trt_calibration_cache(tmp_path / "c.cache")
    assert header == text[0]
    for name, (lo, hi) in ranges.items():
        expected = struct.unpack("f", struct.pack("f", max(abs(lo), abs(hi)) / 127))[0]
        assert scales[name] == pytest.approx(expected, rel=0, abs=0)


@pytest.mark.parametrize(
    ("version", "code"), [("7.1.3", 7103), ("8.6.1", 8601), ("10.3.0", 100300), ("10.14.1", 101401)]
)
def test_trt_version_codes(version: str, code: int) -> None:
    assert trt_version_code(version) == code


def test_malformed_trt_tables_are_rejected(tmp_path) -> None:
    (tmp_path / "a.cache").write_text("{}")
    with pytest.raises(CalibrationError, match="no 'TRT-<version>-<algorithm>' header"):
        read_trt_calibration_cache(tmp_path / "a.cache")
    (tmp_path / "b.cache").write_text("TRT-8601-EntropyCalibration2\nx: zz\n")
    with pytest.raises(CalibrationError, match="line 2"):
        read_trt_calibration_cache(tmp_path / "b.cache")
    with pytest.raises(CalibrationError, match="non-finite"):
        write_trt_calibration_cache({"x": (0.0, float("inf"))}, tmp_path / "c.cache")


def test_importing_calibration_loads_no_backend() -> None:
    code = (
        "import sys, edgecap.calibration as c; c.quantize_int8, c.compare_decoders, c.TrtCalibrator; "
        "print(sorted(m for m in ('onnx', 'onnxruntime', 'tensorrt') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
