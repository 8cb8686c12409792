"""Frozen-backbone training on a feature cache, then end-to-end fine-tuning from images (ExpansionNet v2 §4.3)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from edgecap.workshop.training import checkpoint as ckpt
from edgecap.workshop.training.config import TrainCfg
from edgecap.workshop.training.end_to_end import BACKBONE_WEIGHTS, END_TO_END, FROZEN_WEIGHTS, finetune_end_to_end
from edgecap.workshop.training.loop import build_optimizer, train

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.fixture(scope="module")
def pixel_data(tiny_data, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(dataset, feature cache, backbone weights file): a random 64 px ``test_efficientnet`` stored in a file."""
    from edgecap.workshop.data.feature_cache import extract_features
    from edgecap.workshop.models.backbone import create_backbone

    data, _ = tiny_data
    root = tmp_path_factory.mktemp("e2e")
    torch.manual_seed(0)
    weights = root / "backbone.safetensors"
    save_file(create_backbone("test_efficientnet", pretrained=False, image_size=64).model.state_dict(), str(weights))
    cache = root / "cache"
    extract_features(
        data, cache, "test_efficientnet", image_size=64, weights=weights, progress=False, batch_size=20, num_workers=0
    )
    return data, cache, weights


def _cfg(data: Path, cache: Path, out: Path, **kw) -> TrainCfg:
    base = dict(
        model="expansionnet-test",
        data=str(data),
        features=str(cache),
        out=str(out),
        epochs=2,
        batch_size=8,
        lr=3e-3,
        warmup_steps=2,
        optimizer="radam",
        vocab_min_count=1,
        val_images=4,
        max_words=8,
        save_every_steps=0,
        device="cpu",
        seed=1,
        finetune_epochs=1,
        finetune_lr=1e-3,
        finetune_batch_size=8,
    )
    return TrainCfg(**{**base, **kw})


def test_frozen_then_end_to_end_run(pixel_data, tmp_path):
    from edgecap.workshop.torch_runtime.images import backbone_from_spec

    data, cache, weights = pixel_data
    cfg = _cfg(data, cache, tmp_path / "run", backbone_weights=str(weights))
    run = train(cfg, progress=False)

    summary = json.loads((run / END_TO_END).read_text())
    assert summary["steps"] >= 2 and summary["optimizer"]["betas"] == [0.9, 0.98]
    assert math.isfinite(summary["last_loss"]) and summary["val_cider_d_from_images"] >= 0
    events = [json.loads(x)["event"] for x in (run / ckpt.METRICS).read_text().splitlines()]
    assert events.index("end_to_end") > events.index("val")  # frozen stage (with validation) first

    # both parts changed: the backbone from its original file, the captioner from the frozen-stage weights
    before, after = load_file(str(weights)), load_file(str(run / BACKBONE_WEIGHTS))
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before if before[k].is_floating_point())
    frozen, tuned = load_file(str(run / FROZEN_WEIGHTS)), load_file(str(run / ckpt.WEIGHTS))
    assert any(not torch.equal(frozen[k], tuned[k]) for k in frozen)

    # the run now names the fine-tuned backbone, which rebuilds and verifies from that file
    config = ckpt.read_config(run)
    assert config["backbone"]["weights"]["file"] == BACKBONE_WEIGHTS
    assert config["backbone_before_end_to_end"]["weights"]["sha256"] != config["backbone"]["weights"]["sha256"]
    backbone_from_spec(config["backbone"], weights=run / BACKBONE_WEIGHTS)

    # a second call leaves the finished stage alone
    stamp = (run / BACKBONE_WEIGHTS).stat().st_mtime_ns
    finetune_end_to_end(cfg, run, progress=False)
    assert (run / BACKBONE_WEIGHTS).stat().st_mtime_ns == stamp


def test_length_aware_model_is_fed_its_levels_end_to_end(pixel_data, tmp_path):
    """A ``*-len`` model trains on each caption's ground-truth level in the end-to-end step too (LaBERT §3.1), so
    its level embedding keeps learning there."""
    data, cache, weights = pixel_data
    cfg = _cfg(data, cache, tmp_path / "run", model="expansionnet-test-len", epochs=1, backbone_weights=str(weights))
    run = train(cfg, progress=False)
    summary = json.loads((run / END_TO_END).read_text())
    assert summary["steps"] >= 2 and math.isfinite(summary["last_loss"])
    frozen, tuned = load_file(str(run / FROZEN_WEIGHTS)), load_file(str(run / ckpt.WEIGHTS))
    assert not torch.equal(frozen["level_embed.weight"][1:], tuned["level_embed.weight"][1:])


def test_region_feature_runs_cannot_go_end_to_end(tiny_data, tmp_path):
    data, regions = tiny_data
    cfg = _cfg(data, regions, tmp_path / "run", model="expansionnet-test", epochs=1)
    with pytest.raises(ValueError, match="region features"):
        train(cfg, progress=False)


def test_radam_uses_the_paper_betas():
    model = torch.nn.Linear(2, 2)
    optimizer, _ = build_optimizer(model, TrainCfg(optimizer="radam"), 2)
    assert isinstance(optimizer, torch.optim.RAdam) and optimizer.defaults["betas"] == (0.9, 0.98)


def test_scst_of_a_run_that_fine_tuned_its_backbone_runs_end_to_end(pixel_data, tmp_path):
    from edgecap.workshop.torch_runtime.images import backbone_from_spec
    from edgecap.workshop.training.scst_loop import SCST_STATE, SCST_SUMMARY, XE_BACKBONE

    data, cache, weights = pixel_data
    cfg = _cfg(data, cache, tmp_path / "run", epochs=1, backbone_weights=str(weights))
    cfg = cfg.replace(scst_epochs=1, scst_max_steps=2, scst_lr=1e-3, scst_samples=2, scst_max_words=6)
    run = train(cfg, progress=False)
    assert json.loads((run / SCST_SUMMARY).read_text())["steps"] == 2
    # the backbone SCST started from is kept; the one it trained (in the resumable state) differs from it
    start = load_file(str(run / XE_BACKBONE))
    trained = torch.load(run / SCST_STATE / ckpt.STATE, weights_only=True)["backbone"]
    assert any(not torch.equal(start[k], trained[k]) for k in start if start[k].is_floating_point())
    # whatever backbone the run names (the best by validation), it rebuilds and verifies from its file
    config = ckpt.read_config(run)
    backbone_from_spec(config["backbone"], weights=run / BACKBONE_WEIGHTS)
    # resuming continues from the saved backbone state, to the end of the epoch
    train(cfg.replace(scst_max_steps=0), progress=False)
    assert json.loads((run / SCST_SUMMARY).read_text())["epochs_done"] == 1
