"""``edgecap train --teacher RUN``: distillation from the command line."""

from __future__ import annotations

import json

from click.testing import CliRunner

from edgecap.cli import main
from edgecap.workshop.training import checkpoint as ckpt


def test_distil_from_the_command_line(tiny_data, tiny_parent_run, tmp_path):
    data, feats = tiny_data
    out = tmp_path / "student"
    args = ["train", "--model", "acort-test", "--data", str(data), "--features", str(feats), "--out", str(out),
            "--set", "radix_base=64", "--batch-size", "8", "--max-steps", "2", "--device", "cpu",
            "--teacher", str(tiny_parent_run), "--kd-mode", "both", "--kd-temperature", "3",
            "--kd-beam", "1"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    step = json.loads((out / ckpt.CONFIG).read_text())["compression"][0]
    assert step["mode"] == "both" and step["temperature"] == 3.0 and step["beam"] == 1


def test_teacher_is_not_an_option_of_training_from_a_run(tiny_parent_run, tmp_path):
    args = ["train", "--teacher", str(tiny_parent_run), "scst", str(tiny_parent_run), "--out", str(tmp_path / "x"),
            "--epochs", "1"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "drop --teacher" in result.output
    assert not (tmp_path / "x").exists()


def _student_args(tiny_data, teacher, out, *extra):
    data, feats = tiny_data
    return ["train", "--model", "acort-test", "--data", str(data), "--features", str(feats), "--out", str(out),
            "--set", "radix_base=64", "--batch-size", "8", "--max-steps", "1", "--device", "cpu",
            "--teacher", str(teacher), *extra]  # fmt: skip


def _tree(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_out_is_never_the_teacher_nor_nests_with_it(tiny_data, tiny_parent_run, tmp_path):
    import shutil

    teacher = tmp_path / "runs" / "teacher"
    shutil.copytree(tiny_parent_run, teacher)
    before = _tree(tmp_path)
    for out in (teacher, tmp_path / "runs" / "." / "teacher", teacher / "student", tmp_path / "runs", tmp_path):
        result = CliRunner().invoke(main, _student_args(tiny_data, teacher, out))
        assert result.exit_code == 1 and "--teacher run" in result.output, (out, result.output)
        assert "Traceback" not in result.output
    assert _tree(tmp_path) == before  # the teacher's config is not rewritten as distilled from itself


def test_out_is_never_the_trained_run_nor_nests_with_it(tiny_parent_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_parent_run, run)
    before = _tree(tmp_path)
    for out in (run, run / "scst", tmp_path):
        for command in ("scst", "qat"):
            args = ["train", command, str(run), "--out", str(out), "--epochs", "1", "--device", "cpu"]
            result = CliRunner().invoke(main, args)
            assert result.exit_code == 1 and "the trained run" in result.output, (out, command, result.output)
    assert _tree(tmp_path) == before


def test_refused_teachers_leave_no_out_behind(tiny_data, tiny_parent_run, tmp_path):
    import shutil

    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_parent_run, bundle)
    (bundle / "manifest.json").write_text("{}")  # what makes a directory a bundle
    cases = [
        (bundle, [], "is a bundle, not a training run"),
        (tiny_parent_run, ["--kd-beam", "1000"], "1000 is not in the range"),
        (tiny_parent_run, ["--kd-temperature", "nan"], "not a finite number"),
        (tiny_parent_run, ["--kd-alpha", "inf"], "not in the range"),
    ]
    for teacher, extra, said in cases:
        out = tmp_path / "new" / "student"
        result = CliRunner().invoke(main, _student_args(tiny_data, teacher, out, *extra))
        assert result.exit_code != 0 and said in result.output, (extra, result.output)
        assert not (tmp_path / "new").exists(), extra
    # refused once the teacher is loaded: another vocabulary (word-level KD takes the teacher's), a mask-predict
    # student for word-level KD
    data, feats = tiny_data
    for model in ("expansionnet-test", "labert-test"):
        args = ["train", "--model", model, "--data", str(data), "--features", str(feats), "--out",
                str(tmp_path / "new" / model), "--max-steps", "1", "--device", "cpu", "--teacher",
                str(tiny_parent_run), "--kd-mode", "word"]  # fmt: skip
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1 and "--kd-mode sequence" in result.output, (model, result.output)
        assert not (tmp_path / "new").exists(), model
