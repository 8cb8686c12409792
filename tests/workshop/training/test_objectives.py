"""Training objectives: LaBERT's masked-token loss (§3.2, Eq. 4) and a tiny LaBERT run whose length level
controls the caption length."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from edgecap.workshop.models import create_model
from edgecap.workshop.training.objectives import caption_levels, cross_entropy, masked_lm, objective_for


def test_objective_follows_the_family_and_levels_count_words() -> None:
    labert = create_model("labert-test", vocab_size=20, feature_dim=8)
    acort = create_model("ort-test", vocab_size=20, feature_dim=8)
    assert objective_for(labert) is masked_lm and objective_for(acort) is cross_entropy
    tokens = torch.tensor([[1] + [5] * 9 + [2, 0, 0], [1] + [5] * 10 + [2, 0]])
    assert caption_levels(tokens, 0, labert.levels).tolist() == [1, 2]


def test_masked_lm_scores_only_masked_positions_against_eos_padded_targets() -> None:
    torch.manual_seed(0)
    model = create_model("labert-test", vocab_size=20, feature_dim=8, dropout=0.0)
    seen = {}

    def spy(tokens, level, state):
        seen.setdefault("calls", []).append((tokens.clone(), level.clone()))
        return real(tokens, level, state)

    real, model.refine = model.refine, spy
    visual = SimpleNamespace(features=torch.randn(2, 3, 8), boxes=torch.rand(2, 3, 4), mask=torch.ones(2, 3).bool())
    tokens = torch.tensor([[1, 4, 5, 6, 2, 0, 0, 0, 0, 0, 0, 0], [1] + [7] * 10 + [2]])  # 3 words (level 1), 10 (2)
    cfg = SimpleNamespace(captions_per_image=1, label_smoothing=0.1)
    loss, nll = masked_lm(model, visual, tokens, 0, cfg)
    assert loss.requires_grad and torch.isfinite(loss) and nll > 0
    shapes = sorted((tuple(t.shape), lv.tolist()) for t, lv in seen["calls"])
    assert shapes == [((1, 9), [1]), ((1, 14), [2])]  # each caption at its level's L_high
    for inputs, level in seen["calls"]:
        target = [4, 5, 6] + [2] * 6 if level.item() == 1 else [7] * 10 + [2] * 4
        kept = inputs[0].ne(model.mask_id)
        assert kept.sum() < inputs.shape[1]  # at least one position masked
        assert inputs[0][kept].tolist() == torch.tensor(target)[kept].tolist()  # the rest is the EOS-padded caption


@pytest.mark.filterwarnings("ignore")
def test_tiny_labert_learns_length_control(tiny_data, tmp_path: Path) -> None:
    """A few hundred steps on the tiny synthetic set: the requested level changes the caption length."""
    from edgecap.workshop.evaluation.length_eval import evaluate_run_levels
    from edgecap.workshop.training.config import TrainCfg
    from edgecap.workshop.training.loop import train

    data, feats = tiny_data
    cfg = TrainCfg(
        model="labert-test",
        data=str(data),
        features=str(feats),
        out=str(tmp_path / "run"),
        epochs=200,
        batch_size=8,
        lr=3e-3,
        warmup_steps=10,
        optimizer="adamw-cosine",
        vocab_min_count=1,
        model_overrides={"d_model": 64, "d_ff": 128, "dropout": 0.0},
        val_every=1000,
        device="cpu",
        seed=1,
        max_steps=150,
    )
    run = train(cfg, progress=False)
    summary = evaluate_run_levels(run, split="train", limit=8, tokenizer="simple", metrics=("bleu", "cider"))
    levels = summary["levels"]
    assert set(levels) == {"1", "2", "3", "4"} and levels["4"]["range"] == [20, 25]
    assert levels["1"]["mean_words"] <= 9 < 15 <= levels["4"]["mean_words"]  # the level controls the length
    assert levels["1"]["control_precision"] >= 0.25  # 150 steps on 40 images: control, not yet precision
    assert 0.0 <= summary["diversity"]["div_1"] <= 1.0
    assert (run / "eval" / "train-levels.json").is_file()


@pytest.mark.parametrize(
    ("model", "overrides"),
    [("acort-test-len", {"radix_base": 64}), ("expansionnet-test-len", {})],
    ids=["acort-test-len", "expansionnet-test-len"],
)
def test_length_aware_model_trains_with_the_ground_truth_level(
    tiny_data, tmp_path: Path, model: str, overrides: dict
) -> None:
    """Cross-entropy feeds each caption's level (radix: words = digit tokens / digits) through the same trainer,
    checkpoints and validation (which decodes at the default level), for every autoregressive family."""
    from edgecap.workshop.training.config import TrainCfg
    from edgecap.workshop.training.loop import train

    data, feats = tiny_data
    cfg = TrainCfg(
        model=model,
        data=str(data),
        features=str(feats),
        out=str(tmp_path / "run"),
        epochs=100,
        batch_size=8,
        lr=3e-3,
        warmup_steps=5,
        optimizer="adamw",
        vocab_min_count=1,
        model_overrides=overrides,
        val_images=4,
        device="cpu",
        seed=1,
        max_steps=12,
    )
    run = train(cfg, progress=False)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(x["event"] == "train" for x in lines) and any(x["event"] == "val" for x in lines)
    weights = load_file(str(run / "weights.safetensors"))
    assert weights["level_embed.weight"].shape[0] == 5  # 4 levels + the unused row 0, saved with the run
    levels = caption_levels(
        torch.tensor([[65] + [1, 2] * 10 + [66, 0], [65] + [3, 4] * 3 + [66] + [0] * 15]),
        0,
        ((1, 9), (10, 14), (15, 19), (20, 25)),
        tokens_per_word=2,
    )
    assert levels.tolist() == [2, 1]
