"""ONNX Runtime threading through ``Captioner.load`` and ``edgecap caption``: the policy's choice reaches the
sessions and ``runtime_info``, an explicit value wins, and the captions do not depend on it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from edgecap import Captioner
from edgecap.runtime.backends.threads import SPIN_KEYS
from edgecap.runtime.captioner import CaptionerError
from tests.runtime.bundle.helpers import pixel_bundle

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.fixture(scope="module")
def bundle(tiny_data, tmp_path_factory) -> Path:
    return pixel_bundle(tiny_data, tmp_path_factory)[0]


@pytest.fixture(scope="module")
def images(tiny_data) -> list[Path]:
    return sorted((tiny_data[0] / "images").iterdir())[:3]


def _session_settings(captioner: Captioner) -> list[dict]:
    step_model = captioner.step_model
    return [runtime.session_settings for runtime in (step_model.encoder, step_model.loop_runtime)]


def _spin(settings: dict) -> list[str | None]:
    return [settings[key] for key in SPIN_KEYS]


def test_the_default_is_one_thread_without_spinning(bundle, images):
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32") as cap:
        threads = cap.runtime_info["threads"]
        assert (threads["intra_op"], threads["inter_op"], threads["spin"], threads["policy"]) == (1, 1, False, "auto")
        assert "1 thread, no spinning" in cap.runtime_info["summary"]
        for settings in _session_settings(cap):
            assert (settings["intra_op_threads"], settings["execution_mode"]) == (1, "sequential")
            assert _spin(settings) == ["0", "0"]
        reference = cap.batch(images)
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32", threads=3, spin=True) as cap:
        threads = cap.runtime_info["threads"]
        assert (threads["intra_op"], threads["spin"], threads["policy"]) == (3, True, "explicit")
        for settings in _session_settings(cap):
            assert settings["intra_op_threads"] == 3 and _spin(settings) == ["1", "1"]
        assert cap.batch(images) == reference  # threading never changes a caption
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32", threads=2, streams=2) as cap:
        assert cap.runtime_info["threads"]["intra_op"] == 2  # an explicit count wins over the streams
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32", threads=0) as cap:
        assert cap.runtime_info["threads"]["policy"] == "onnxruntime-default"
        for settings in _session_settings(cap):
            assert settings["intra_op_threads"] == 0 and _spin(settings) == [None, None]
        assert cap.batch(images) == reference


def test_dedicated_keeps_a_small_step_graph_on_one_thread(bundle):
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32", threads="dedicated", spin=False) as cap:
        threads = cap.runtime_info["threads"]
        assert (threads["intra_op"], threads["spin"], threads["policy"]) == (1, False, "dedicated")
        assert "small step graph" in threads["reason"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"threads": -1}, "threads"),
        ({"threads": "all"}, "threads"),
        ({"threads": 10**6}, "at most"),
        ({"spin": 1}, "spin"),
        ({"streams": 0}, "streams"),
    ],
)
def test_bad_thread_settings_are_refused(bundle, kwargs, match):
    with pytest.raises(CaptionerError, match=match):
        Captioner.load(bundle, runtime="onnxruntime", **kwargs)


def test_the_caption_command_passes_threads_and_spin(bundle, images):
    from edgecap.cli import main

    base = ["caption", *map(str, images[:2]), "--model", str(bundle), "--runtime", "onnxruntime"]
    default = CliRunner().invoke(main, [*base, "--precision", "fp32"])
    assert default.exit_code == 0, default.output
    assert "1 thread, no spinning" in default.output
    chosen = CliRunner().invoke(main, [*base, "--precision", "fp32", "--threads", "2", "--spin"])
    assert chosen.exit_code == 0, chosen.output
    assert "2 threads, spinning" in chosen.output
    captions = [line for line in default.output.splitlines() if not line.startswith("runtime:")]
    assert captions == [line for line in chosen.output.splitlines() if not line.startswith("runtime:")]
    bad = CliRunner().invoke(main, [*base, "--threads", "lots"])
    assert bad.exit_code != 0 and "auto, dedicated" in bad.output


def test_an_explicit_count_sets_torch_threads_only_where_torch_runs(bundle, images):
    import torch

    from edgecap.cli import main

    base = ["caption", *map(str, images[:1]), "--model", str(bundle), "--precision", "fp32"]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        on_onnxruntime = CliRunner().invoke(main, [*base, "--runtime", "onnxruntime", "--threads", "1"])
        assert on_onnxruntime.exit_code == 0, on_onnxruntime.output
        assert torch.get_num_threads() == 2  # ONNX Runtime alone: torch is not this command's to change
        on_torch = CliRunner().invoke(main, [*base, "--runtime", "torch", "--threads", "1"])
        assert on_torch.exit_code == 0, on_torch.output
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        policy = CliRunner().invoke(main, [*base, "--runtime", "torch", "--threads", "auto"])
        assert policy.exit_code == 0, policy.output
        assert torch.get_num_threads() == 2  # a policy names ONNX Runtime's threads, not a torch count
    finally:
        torch.set_num_threads(before)


def test_auto_runs_large_calls_on_a_wide_session_with_the_same_captions(bundle, images, monkeypatch):
    from edgecap.runtime.backends import threads as thread_policy

    monkeypatch.setattr(thread_policy, "usable_cores", lambda: 4)  # four free cores, one stream
    monkeypatch.setitem(thread_policy.WIDE_FROM_ROWS, "step", 3)  # one image x beam 3 reaches it
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32", threads=1) as cap:
        reference, single = cap.batch(images), cap.batch(images[:1])
        assert cap.runtime_info["threads"]["wide"] is None  # an explicit count never widens
        assert cap.runtime_info["threads"]["decode_workers"] == cap.step_model.decode_workers == 1  # nor splits
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32") as cap:
        threads = cap.runtime_info["threads"]
        assert threads["wide"] == {"intra_op": 4, "spin": False, "from_rows": {"encoder": 2, "step": 3}}
        assert threads["decode_workers"] == cap.step_model.decode_workers == 4
        assert "4 threads, no spinning, from 2 (encoder) / 3 (step) rows" in cap.runtime_info["summary"]
        runtimes = (cap.step_model.encoder, cap.step_model.loop_runtime)
        assert cap.batch(images) == reference  # three images: three concurrent chunks of one image each ...
        assert all(runtime.wide_session is None for runtime in runtimes)  # ... on the one-thread sessions
        assert cap.batch(images[:1]) == single  # one image: nothing to split; its 3-row steps go wide
        assert cap.step_model.loop_runtime.wide_session is not None and cap.step_model.encoder.wide_session is None
        assert cap.step_model.loop_runtime.wide_inference_count > 0
        for settings in _session_settings(cap)[1:]:  # the step runtime's
            assert settings["intra_op_threads"] == 1
            assert settings["wide"]["intra_op_threads"] == 4 and _spin(settings["wide"]) == ["0", "0"]
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32", streams=4) as cap:
        assert cap.runtime_info["threads"]["wide"] is None  # one core per stream: nothing to widen to


def test_thread_counts_are_bounded_by_the_cpus(monkeypatch):
    import os

    from edgecap.runtime.backends.threads import MAX_THREADS_PER_CPU, ThreadSettingError, check_threads, max_threads

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert max_threads() == 2 * MAX_THREADS_PER_CPU
    check_threads(max_threads())  # a little oversubscription is a measurement someone may want
    with pytest.raises(ThreadSettingError, match=f"at most {max_threads()}"):
        check_threads(max_threads() + 1)


@pytest.mark.parametrize("command", [["caption", "x.jpg"], ["export", "--model", "m"], ["bench", "--bundle", "b"]])
def test_the_commands_refuse_thousands_of_threads_before_starting_them(command):
    from edgecap.cli import main

    result = CliRunner().invoke(main, [*command, "--threads", "3000"])
    assert result.exit_code == 2, result.output
    assert "--threads" in result.output and "at most" in result.output
