import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from edgecap.runtime.vocab import load_vocab
from edgecap.workshop.data.datasets import load_dataset
from edgecap.workshop.data.sources import open_feature_source
from edgecap.workshop.models import cfg_from_dict, create_model_from_cfg
from edgecap.workshop.training import checkpoint as ckpt
from edgecap.workshop.training.batches import FeatureBank
from edgecap.workshop.training.config import TrainCfg
from edgecap.workshop.training.loop import train
from edgecap.workshop.training.rewards import CaptionReward
from edgecap.workshop.training.scst_loop import SCST_STATE, SCST_SUMMARY, XE_WEIGHTS, init_from_run, rollout, train_scst
from tests.workshop.training.helpers import tiny_train_cfg


def _cfg(tiny_data, out: Path, **kw) -> TrainCfg:
    scst = {"scst_batch_size": 8, "scst_lr": 5e-3, "scst_anneal": 1.0}
    return tiny_train_cfg(tiny_data, out, **{"epochs": 3, **scst, **kw})


def _mean_train_reward(run: Path, cfg: TrainCfg, weights: str) -> float:
    """Mean reward of 8 seeded samples per training image under the given weights (a fixed yardstick)."""
    config = ckpt.read_config(run)
    vocab = load_vocab(run / ckpt.VOCAB)
    model = create_model_from_cfg(cfg_from_dict(config["model"]["cfg"]), vocab.size)
    ckpt.load_weights(model, run / weights)
    records = load_dataset(cfg.data).split("train")
    bank = FeatureBank(open_feature_source(cfg.features), [r.image_id for r in records])
    reward = CaptionReward([r.captions for r in records], eos_word=True)
    refs = [reward.references(r.captions) for r in records]
    roll = rollout(model, bank.batch(range(len(records))), refs, vocab, cfg.replace(scst_samples=8), reward, seed=5)
    return float(roll.rewards.mean())


def _events(run: Path, name: str) -> list[dict]:
    return [r for r in map(json.loads, (run / ckpt.METRICS).read_text().splitlines()) if r["event"] == name]


def test_scst_after_cross_entropy_raises_the_training_reward(tiny_data, tmp_path):
    cfg = _cfg(tiny_data, tmp_path / "run", scst_epochs=8)
    run = train(cfg, progress=False)
    before = _mean_train_reward(run, cfg, XE_WEIGHTS)
    after = _mean_train_reward(run, cfg, (SCST_STATE / ckpt.WEIGHTS).as_posix())
    assert after > before * 1.5, (before, after)
    scst = _events(run, "scst")
    assert scst and all(np.isfinite(r["loss"]) for r in scst)
    vals = _events(run, "scst_val")
    assert [v["epoch"] for v in vals] == list(range(-1, 8))  # the starting model, then every epoch
    summary = json.loads((run / SCST_SUMMARY).read_text())
    assert summary["epochs_done"] == 8 and summary["start_val_cider_d"] == vals[0]["cider_d"]
    assert summary["best_val_cider_d"] == max(v["cider_d"] for v in vals)
    assert (run / XE_WEIGHTS).is_file() and (run / ckpt.WEIGHTS).is_file()


def test_scst_resume_mid_stage_gives_the_same_weights(tiny_data, tmp_path):
    base = _cfg(tiny_data, tmp_path / "xe", scst_epochs=0, epochs=1)
    xe = train(base, progress=False)
    straight = init_from_run(xe, tmp_path / "straight")
    train_scst(base.replace(out=str(straight), scst_epochs=2, scst_max_steps=6), progress=False)
    interrupted = init_from_run(xe, tmp_path / "interrupted")
    train_scst(base.replace(out=str(interrupted), scst_epochs=2, scst_max_steps=3), progress=False)
    state = torch.load(interrupted / SCST_STATE / ckpt.STATE, weights_only=True)
    assert state["progress"]["step"] == 3 and state["progress"]["batch_in_epoch"] == 3  # stopped mid-epoch
    train_scst(base.replace(out=str(interrupted), scst_epochs=2, scst_max_steps=6), progress=False)
    a = load_file(straight / SCST_STATE / ckpt.WEIGHTS)
    b = load_file(interrupted / SCST_STATE / ckpt.WEIGHTS)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def test_scst_greedy_baseline_and_length_aware_model(tiny_data, tmp_path):
    cfg = _cfg(tiny_data, tmp_path / "run", model="acort-test-len", epochs=1, scst_epochs=1)
    cfg = cfg.replace(scst_baseline="greedy", scst_samples=2, scst_max_steps=2, scst_bleu_weight=1.0)
    run = train(cfg, progress=False)
    assert json.loads((run / SCST_SUMMARY).read_text())["steps"] == 2


def test_scst_refuses_a_non_autoregressive_model(tiny_data, tmp_path):
    cfg = _cfg(tiny_data, tmp_path / "run", model="labert-test", model_overrides={}, epochs=1, max_steps=1)
    run = train(cfg.replace(optimizer="adamw-cosine"), progress=False)
    with pytest.raises(ValueError, match="not autoregressive"):
        train_scst(cfg.replace(scst_epochs=1), run, progress=False)


def test_scst_settings_are_checked(tiny_data, tmp_path):
    with pytest.raises(ValueError, match="needs more samples"):
        train_scst(_cfg(tiny_data, tmp_path / "x", scst_epochs=1, scst_samples=1), progress=False)
    with pytest.raises(ValueError, match="unknown SCST baseline"):
        train_scst(_cfg(tiny_data, tmp_path / "x", scst_epochs=1, scst_baseline="mean"), progress=False)
