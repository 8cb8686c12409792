"""``Captioner.load(bundle)``: the embedded API on verified bundles, the same captions as the torch run."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from edgecap import Captioner
from edgecap.runtime.bundle import BundleError, BundleIntegrityError, load_bundle
from edgecap.runtime.captioner import CaptionerError
from edgecap.runtime.decoding.config import MAX_BEAM
from tests.runtime.bundle.helpers import copy_bundle, pixel_bundle, pixel_run, region_bundle, region_run

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.fixture(scope="module")
def pixels(tiny_data, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(pixel bundle, its run, the run's backbone weights)."""
    bundle, _ = pixel_bundle(tiny_data, tmp_path_factory)
    run, weights = pixel_run(tiny_data, tmp_path_factory)
    return bundle, run, weights


@pytest.fixture(scope="module")
def images(tiny_data) -> list[Path]:
    return sorted((tiny_data[0] / "images").iterdir())[:5]


def test_pixels_to_captions_match_the_torch_run_at_fp32_beam_3(pixels, images):
    bundle, run, weights = pixels
    expected = Captioner.from_run(run, beam=3, backbone_weights=weights).batch(images)
    assert all(expected)  # non-empty captions: the comparison means something
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32", beam=3) as cap:
        assert cap.runtime_info["backbone"].startswith("in the encoder graph") and cap.backbone is None
        assert cap.batch(images) == expected
        assert cap(images[0]) == expected[0]
        assert cap.batch(images, batch_size=2) == expected


def test_the_torch_runtime_uses_the_bundled_weights_and_backbone(pixels, images):
    bundle, run, weights = pixels
    expected = Captioner.from_run(run, beam=3, backbone_weights=weights).batch(images[:2])
    cap = Captioner.load(bundle, runtime="torch", device="cpu")  # from_run decodes on the CPU too
    assert cap.runtime_info["runtime"] == "torch" and cap.runtime_info["precision"] == "fp32"
    assert cap.backbone is not None and cap.batch(images[:2]) == expected


def test_auto_reports_which_runtime_it_chose(pixels, images, caplog):
    bundle, _, _ = pixels
    with caplog.at_level(logging.INFO, logger="edgecap.runtime.captioner"):
        cap = Captioner.load(bundle)
    info = cap.runtime_info
    assert info["runtime"] == "onnxruntime" and info["runtime_reason"].startswith("onnxruntime: the first installed")
    assert info["providers"][-1] == "CPUExecutionProvider" and info["precision"] == "fp32"
    assert info["model"] == "ort-test" and info["beam"] == 3 and info["bundle"] == str(bundle)
    assert info["summary"] in caplog.text and "CPUExecutionProvider" in caplog.text
    assert repr(cap).startswith("Captioner(ort-test on onnxruntime [")


def test_region_bundle_round_trip_matches_the_torch_run(tiny_data, tmp_path_factory):
    """A bundle of a region-feature run captions features (not images) exactly like the torch run."""
    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.data.sources import open_feature_source
    from edgecap.workshop.runs import load_run
    from edgecap.workshop.torch_runtime.captioning import caption_bank
    from edgecap.workshop.training.batches import FeatureBank

    bundle = region_bundle(tiny_data, tmp_path_factory)
    trained = load_run(region_run(tiny_data, tmp_path_factory))
    data, feats = tiny_data
    records = load_dataset(data).split("test") + load_dataset(data).split("val")
    bank = FeatureBank(open_feature_source(feats), [r.image_id for r in records])
    expected = caption_bank(trained.model, bank, trained.vocab, beam_size=3, max_words=trained.max_words)
    batch = bank.batch(list(range(len(records)))).as_inputs()
    with Captioner.load(bundle, precision="fp32") as cap:
        assert cap.caption_inputs(batch) == expected
        with pytest.raises(CaptionerError, match="precomputed region features"):
            cap.batch([tiny_data[0] / "images" / "000000.png"])
    with Captioner.load(bundle, precision="fp16") as cap:
        assert len(cap.caption_inputs(batch)) == len(records)


def test_auto_precision_on_cpu_takes_int8_when_its_preset_suits_this_cpu(tiny_data, tmp_path_factory):
    from edgecap.workshop.export.calibration import detect_cpu_preset

    bundle = region_bundle(tiny_data, tmp_path_factory)
    preset = load_bundle(bundle, graphs="none").variant("int8")["preset"]
    with Captioner.load(bundle, runtime="onnxruntime") as cap:
        suits = preset in (detect_cpu_preset(), "cpu-avx2")
        assert cap.runtime_info["precision"] == ("int8" if suits else "fp32")
        assert preset in cap.runtime_info["precision_reason"]


def test_requests_the_bundle_or_machine_cannot_serve(pixels, tiny_data, tmp_path_factory):
    bundle, _, _ = pixels
    with pytest.raises(BundleError, match=r"no 'int8' variant \(it holds \['fp32'\]\)"):
        Captioner.load(bundle, precision="int8")
    with pytest.raises(CaptionerError, match="INT8 graphs need runtime='onnxruntime'"):
        Captioner.load(region_bundle(tiny_data, tmp_path_factory), runtime="torch", precision="int8")
    with pytest.raises(CaptionerError, match=r"unknown runtime 'tensorflow'; registered: \['onnxruntime', 'torch'"):
        Captioner.load(bundle, runtime="tensorflow")
    for beam in (0, MAX_BEAM + 1, 2000):
        with pytest.raises(CaptionerError, match=rf"beam must be an integer in 1\.\.{MAX_BEAM} \(MAX_BEAM\)"):
            Captioner.load(bundle, beam=beam)
    with pytest.raises(CaptionerError, match="precision must be 'auto' or one of"):
        Captioner.load(bundle, precision="bf16")


def test_a_corrupt_bundle_is_refused_by_load(pixels, tmp_path: Path):
    copy = copy_bundle(pixels[0], tmp_path / "copy")
    weights = copy / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(BundleIntegrityError, match=r"weights\.safetensors: SHA-256"):
        Captioner.load(copy, runtime="torch")
    with Captioner.load(copy, runtime="onnxruntime") as cap:  # the ONNX runtime never reads the torch weights
        assert cap.runtime_info["runtime"] == "onnxruntime"


def test_a_three_line_script_needs_no_training_code(pixels, images):
    bundle, _, _ = pixels
    script = (
        "import sys; from edgecap import Captioner\n"
        f"cap = Captioner.load({str(bundle)!r})\n"
        f"print(cap({str(images[0])!r}))\n"
        "heavy = [m for m in ('torch', 'timm', 'onnx', 'onnxscript', 'matplotlib', 'pycocoevalcap', "
        "'edgecap.bench') if m in sys.modules]\n"
        # the workshop half's entry-point registration module (names, no torch) is the one part of it a device loads
        "plugin = ('edgecap.workshop', 'edgecap.workshop.torch_runtime', 'edgecap.workshop.torch_runtime.plugin')\n"
        "heavy += [m for m in sys.modules if m.startswith('edgecap.workshop') and m not in plugin]\n"
        "print('HEAVY', heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    caption, heavy = done.stdout.strip().splitlines()
    assert caption and heavy == "HEAVY []"


def test_concurrent_calls_give_the_serial_captions(pixels, images):
    """Four threads on one Captioner, each captioning every image several times, agree with serial calls."""
    from concurrent.futures import ThreadPoolExecutor

    with Captioner.load(pixels[0], runtime="onnxruntime", precision="fp32", threads=1) as cap:
        serial = cap.batch(images)
        jobs = [images[i % len(images) :] + images[: i % len(images)] for i in range(8)]
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(lambda order: cap.batch(order, batch_size=2), jobs))
    for order, got in zip(jobs, results, strict=True):
        assert got == [serial[images.index(path)] for path in order]


def test_one_array_is_one_image_not_its_rows(pixels, images):
    import numpy as np
    from PIL import Image

    with Captioner.load(pixels[0], runtime="onnxruntime", precision="fp32") as cap:
        array = np.asarray(Image.open(images[0]).convert("RGB"))
        assert array.ndim == 3
        assert cap.batch(array) == [cap(images[0])]
        assert cap.batch(np.stack([array, array])) == [cap(images[0])] * 2
        with pytest.raises(CaptionerError, match="H×W"):
            cap.batch(np.zeros((1, 2, 3, 4, 5), dtype=np.uint8))


def test_load_hashes_only_the_files_it_reads(tiny_data, tmp_path_factory, tmp_path: Path):
    """A corrupt INT8 graph does not stop loading FP32 (it is never read), and is caught when INT8 is asked for."""
    source = load_bundle(region_bundle(tiny_data, tmp_path_factory), graphs="none")
    copy = copy_bundle(source.path, tmp_path / "copy")
    graph = copy / source.variant("int8")["files"]["step"]
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0x01
    graph.write_bytes(bytes(data))
    with Captioner.load(copy, runtime="onnxruntime", precision="fp32") as cap:
        assert cap.runtime_info["precision"] == "fp32"
    with pytest.raises(BundleIntegrityError, match=r"SHA-256"):
        Captioner.load(copy, runtime="onnxruntime", precision="int8")
    graph.write_bytes(graph.read_bytes()[:-10])  # sizes of every file are still checked
    with pytest.raises(BundleIntegrityError, match=r"truncated or modified"):
        Captioner.load(copy, runtime="onnxruntime", precision="fp32")


def test_loading_changes_no_process_wide_settings(pixels):
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    with Captioner.load(pixels[0], runtime="torch", threads=target) as cap:
        assert cap.runtime_info["runtime"] == "torch"
    with Captioner.load(pixels[0], runtime="onnxruntime", threads=target):
        pass
    assert torch.get_num_threads() == before


def test_a_bare_model_name_finds_its_bundle_under_edgecap_home(pixels, images, tmp_path: Path, monkeypatch):
    from click.testing import CliRunner

    from edgecap.cli import main

    monkeypatch.setenv("EDGECAP_HOME", str(tmp_path))
    copy_bundle(pixels[0], tmp_path / "bundles" / "ort-test")
    with Captioner.load("ort-test", runtime="onnxruntime", precision="fp32") as cap:
        assert Path(cap.runtime_info["bundle"]) == tmp_path / "bundles" / "ort-test"
        expected = cap.batch(images[:2])
    result = CliRunner().invoke(main, ["caption", *map(str, images[:2]), "--model", "ort-test", "--json"])
    assert result.exit_code == 0, result.output
    assert list(json.loads(result.output).values()) == expected
    result = CliRunner().invoke(main, ["caption", str(images[0]), "--model", "no-such-model"])
    assert result.exit_code != 0 and "no-such-model" in result.output


def test_batch_can_skip_images_that_do_not_load(pixels, images, tmp_path: Path):
    from click.testing import CliRunner

    from edgecap.cli import main
    from edgecap.runtime.captioner import SkippedImageWarning
    from edgecap.runtime.images.load import ImageError, ImageNotFoundError

    missing = tmp_path / "missing.jpg"
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(images[1].read_bytes()[:200])
    mixed = [images[0], missing, images[1], truncated, images[2]]
    with Captioner.load(pixels[0], runtime="onnxruntime", precision="fp32") as cap:
        expected = cap.batch([images[0], images[1], images[2]])
        with pytest.raises(ImageNotFoundError):
            cap.batch(mixed)  # the default is today's: raise
        with pytest.warns(SkippedImageWarning) as caught:
            got = cap.batch(mixed, batch_size=2, errors="skip")
        assert got == [expected[0], None, expected[1], None, expected[2]]
        skipped = [w.message for w in caught if isinstance(w.message, SkippedImageWarning)]
        assert [(w.index, w.image) for w in skipped] == [(1, missing), (3, truncated)]
        assert all(isinstance(w.error, ImageError) and str(w.image) in str(w.error) for w in skipped)
        with pytest.raises(CaptionerError, match="errors must be 'raise' or 'skip'"):
            cap.batch(images, errors="ignore")

    args = ["caption", *map(str, mixed), "--model", str(pixels[0]), "--runtime", "onnxruntime", "--precision", "fp32"]
    result = CliRunner().invoke(main, [*args, "--skip-bad-images"])
    assert result.exit_code == 1
    assert f"{images[0]}: {expected[0]}" in result.stdout and f"{images[2]}: {expected[2]}" in result.stdout
    assert str(missing) in result.stderr and str(truncated) in result.stderr
    assert str(missing) not in result.stdout
    as_json = CliRunner().invoke(main, [*args, "--skip-bad-images", "--json"])
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)[str(missing)] is None
