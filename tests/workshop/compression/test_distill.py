"""Knowledge distillation: the losses by hand, the teacher-caption cache, and students of each kind."""

from __future__ import annotations

import json
import math

import pytest
import torch

from edgecap.workshop.compression import distill
from edgecap.workshop.compression.distill import CAPTION_CACHE, DistillationError, kd_loss
from edgecap.workshop.training import checkpoint as ckpt
from edgecap.workshop.training.loop import train
from edgecap.workshop.training.losses import label_smoothed_nll
from tests.workshop.training.helpers import tiny_train_cfg


def test_kd_loss_by_hand():
    pad = 0
    student = torch.log(torch.tensor([[[0.2, 0.5, 0.3], [0.6, 0.2, 0.2], [0.1, 0.1, 0.8]]]))
    teacher = torch.log(torch.tensor([[[0.1, 0.8, 0.1], [0.3, 0.3, 0.4], [0.5, 0.25, 0.25]]]))
    targets = torch.tensor([[1, 2, pad]])  # the third position is padding: ignored
    loss, nll = kd_loss(student, teacher, targets, pad, temperature=1.0, alpha=0.5)
    hard = -(math.log(0.5) + math.log(0.2)) / 2
    kl = [
        sum(p * math.log(p / q) for p, q in zip([0.1, 0.8, 0.1], [0.2, 0.5, 0.3], strict=True)),
        sum(p * math.log(p / q) for p, q in zip([0.3, 0.3, 0.4], [0.6, 0.2, 0.2], strict=True)),
    ]
    assert float(nll) == pytest.approx(hard, rel=1e-5)
    assert float(loss) == pytest.approx(0.5 * hard + 0.5 * sum(kl) / 2, rel=1e-5)


def test_temperature_softens_both_and_scales_by_its_square():
    torch.manual_seed(0)
    student = torch.log_softmax(torch.randn(2, 3, 5), dim=-1)
    teacher = torch.log_softmax(torch.randn(2, 3, 5), dim=-1)
    targets = torch.randint(1, 5, (2, 3))
    t = 3.0
    soft_s, soft_t = torch.log_softmax(student / t, -1), torch.log_softmax(teacher / t, -1)
    kl = (soft_t.exp() * (soft_t - soft_s)).sum(-1).mean()
    loss, _ = kd_loss(student, teacher, targets, 0, temperature=t, alpha=1.0)
    assert float(loss) == pytest.approx(t * t * float(kl), rel=1e-5)
    hard_only, _ = kd_loss(student, teacher, targets, 0, temperature=t, alpha=0.0, smoothing=0.1)
    assert float(hard_only) == pytest.approx(float(label_smoothed_nll(student, targets, 0, 0.1)[0]), rel=1e-6)
    same, _ = kd_loss(student, student, targets, 0, temperature=t, alpha=1.0)
    assert float(same) == pytest.approx(0.0, abs=1e-6)


def _student(tiny_data, out, teacher, mode, **overrides):
    settings = {"max_steps": 3, "val_images": 0, "kd_beam": 2, "model_overrides": {"radix_base": 64}, **overrides}
    return tiny_train_cfg(tiny_data, out, teacher=str(teacher), kd_mode=mode, **settings)


@pytest.mark.parametrize("mode", ["word", "both"])
def test_a_student_learns_from_the_teacher_tokens(tiny_data, tiny_parent_run, tmp_path, mode):
    run = train(_student(tiny_data, tmp_path / "s", tiny_parent_run, mode), progress=False)
    config = json.loads((run / ckpt.CONFIG).read_text())
    step = config["compression"][0]
    assert step["kind"] == "distillation" and step["mode"] == mode and step["teacher"] == str(tiny_parent_run)
    assert (run / ckpt.VOCAB).read_bytes() == (tiny_parent_run / ckpt.VOCAB).read_bytes()  # the teacher's ids
    assert (run / CAPTION_CACHE).is_file() == (mode == "both")
    losses = [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert losses and all(math.isfinite(x) for x in losses)


def test_teacher_captions_are_decoded_once_and_reused(tiny_data, tiny_parent_run, tmp_path, monkeypatch):
    out = tmp_path / "s"
    train(_student(tiny_data, out, tiny_parent_run, "sequence"), progress=False)
    cached = json.loads((out / CAPTION_CACHE).read_text())
    assert cached["beam"] == 2 and cached["captions"]

    import edgecap.workshop.torch_runtime.captioning as captioning

    def must_not_decode(*args, **kwargs):
        raise AssertionError("the teacher decoded again")

    monkeypatch.setattr(captioning, "caption_bank", must_not_decode)
    train(_student(tiny_data, out, tiny_parent_run, "sequence"), progress=False)  # resumes: captions from the cache


def test_labert_learns_from_an_autoregressive_teachers_captions(tiny_data, tiny_parent_run, tmp_path):
    cfg = tiny_train_cfg(
        tiny_data, tmp_path / "labert", model="labert-test", optimizer="adamw-cosine", max_steps=2, val_images=0,
        model_overrides={"d_model": 32, "d_ff": 64}, teacher=str(tiny_parent_run), kd_mode="sequence",
    )  # fmt: skip
    run = train(cfg, progress=False)
    assert json.loads((run / ckpt.CONFIG).read_text())["compression"][0]["mode"] == "sequence"
    with pytest.raises(ValueError, match="kd-mode sequence"):
        train(cfg.replace(out=str(tmp_path / "word"), kd_mode="word"), progress=False)
    assert not (tmp_path / "word").exists()
    for mode in ("word", "sequence", "both"):  # a LaBERT teacher has neither token distributions nor beam captions
        with pytest.raises(DistillationError, match="needs (an autoregressive teacher|the teacher.s vocabulary)"):
            train(_student(tiny_data, tmp_path / "new" / mode, run, mode), progress=False)
        assert not (tmp_path / "new").exists()


def test_bad_requests_are_refused(tiny_data, tiny_parent_run, tmp_path):
    with pytest.raises(DistillationError, match="kd_mode"):
        train(_student(tiny_data, tmp_path / "a", tiny_parent_run, "sideways"), progress=False)
    for bad in ({"kd_temperature": math.inf}, {"kd_alpha": math.nan}, {"kd_beam": 1000}):
        with pytest.raises(DistillationError, match="kd_temperature|kd_beam"):
            train(_student(tiny_data, tmp_path / "a", tiny_parent_run, "both", **bad), progress=False)
    with pytest.raises(DistillationError, match="wide features"):  # a teacher on other features
        train(_student(tiny_data, tmp_path / "a", tiny_parent_run, "word", features=_wide(tiny_data, tmp_path)))
    assert not (tmp_path / "a").exists()
    with pytest.raises(DistillationError, match="not a trained run"):
        distill.load_teacher(tmp_path, feature_dim=24)
    with pytest.raises(DistillationError, match="wide features"):
        distill.load_teacher(tiny_parent_run, feature_dim=99)


def _wide(tiny_data, tmp_path):
    """The tiny region features, 32 wide instead of 24 (another backbone's)."""
    import numpy as np

    wide = tmp_path / "wide"
    wide.mkdir()
    for path in tiny_data[1].glob("*.npz"):
        with np.load(path) as arrays:
            stored = dict(arrays)
        stored["feat"] = np.concatenate([stored["feat"], stored["feat"][:, :8]], axis=1)
        np.savez(wide / path.name, **stored)
    return str(wide)


def test_a_failed_setup_removes_only_the_directories_it_created(tiny_data, tiny_parent_run, tmp_path, monkeypatch):
    def no_captions(*args, **kwargs):
        raise RuntimeError("the teacher failed to decode")

    monkeypatch.setattr(distill, "teacher_captions", no_captions)
    with pytest.raises(RuntimeError, match="failed to decode"):
        train(_student(tiny_data, tmp_path / "a" / "b" / "s", tiny_parent_run, "sequence"), progress=False)
    assert not (tmp_path / "a").exists()  # every directory the call made, parents included
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="failed to decode"):
        train(_student(tiny_data, kept, tiny_parent_run, "sequence"), progress=False)
    assert (kept / "notes.txt").read_text() == "mine"  # a directory that was there before stays
