"""Structured pruning: an unpruned plan keeps the function, a pruned model equals the masked original, the planted
least important units go first, and a pruned run loads, exports with parity and decodes."""

from __future__ import annotations

import json

import pytest
import torch

from edgecap.workshop.compression.prune import (
    Importance,
    PruneError,
    apply_plan,
    count_params,
    min_params,
    plan_pruning,
    pruned_cfg,
    taylor_importance,
)
from edgecap.workshop.models import create_model

RADIX = 10


def _model(name: str = "acort-test", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model(name, vocab_size=RADIX + 3, feature_dim=16, radix_base=RADIX, **overrides).eval()


def _inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(3, 5, 16, generator=g)
    xy = torch.rand(3, 5, 2, generator=g) * 0.5
    boxes = torch.cat((xy, xy + 0.1 + torch.rand(3, 5, 2, generator=g) * 0.4), dim=-1)
    tokens = torch.randint(1, RADIX + 3, (3, 7), generator=g)
    return features, boxes, tokens


def _random_importance(model) -> Importance:
    g = torch.Generator().manual_seed(4)
    heads = {n: torch.rand(m.heads, generator=g) for n, m in model.named_modules() if hasattr(m, "out_proj")}
    ffn = {n: torch.rand(m.fc1.out_features, generator=g) for n, m in model.named_modules() if hasattr(m, "fc1")}
    return Importance(heads, ffn)


@pytest.mark.parametrize("name", ["acort-test", "acort-test-qk", "ort-test"])
def test_nothing_pruned_keeps_the_model(name):
    model = _model(name, heads=4)
    plan = plan_pruning(model, _random_importance(model), count_params(model))
    pruned = apply_plan(model, plan)
    assert pruned.cfg == model.cfg
    features, boxes, tokens = _inputs()
    with torch.no_grad():
        assert torch.equal(pruned(features, boxes, None, tokens), model(features, boxes, None, tokens))


@pytest.mark.parametrize("name", ["acort-test", "acort-test-qk", "ort-test"])
def test_pruned_model_equals_the_original_with_its_units_zeroed(name):
    model = _model(name, heads=4)
    imp = _random_importance(model)
    plan = plan_pruning(model, imp, count_params(model) - 2500)
    pruned = apply_plan(model, plan)
    assert count_params(pruned) == plan.params <= count_params(model) - 2500
    assert pruned.cfg.heads < 4 and pruned.cfg.head_dim == model.cfg.head_dim
    # Zero exactly what the plan removes (a head's out_proj columns, a channel's fc2 column): same function.
    modules = dict(model.named_modules())
    with torch.no_grad():
        for n, kept in plan.heads.items():
            a = modules[n]
            for h in set(range(a.heads)) - set(kept):
                a.out_proj.weight[:, h * a.head_dim : (h + 1) * a.head_dim] = 0
        for n, kept in plan.ffn.items():
            f = modules[n]
            f.fc2.weight[:, sorted(set(range(f.fc1.out_features)) - set(kept))] = 0
        features, boxes, tokens = _inputs()
        torch.testing.assert_close(pruned(features, boxes, None, tokens), model(features, boxes, None, tokens))
    # a shared layer (the (0x2) maps) is one module, pruned once for every position
    assert len(plan.heads) == len({id(m) for m in modules.values() if hasattr(m, "out_proj")})


def test_taylor_importance_prunes_the_planted_units_first():
    model = _model(heads=4)
    planted_head, planted_channels = 1, [5, 17]
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "out_proj"):
                m.out_proj.weight[:, planted_head * m.head_dim : (planted_head + 1) * m.head_dim] = 0
            if hasattr(m, "fc1"):
                m.fc2.weight[:, planted_channels] = 0
    features, boxes, tokens = _inputs()

    def losses():
        for seed in range(3):
            f, b, t = _inputs(seed)
            logp = model(f, b, None, t[:, :-1])
            yield -logp.gather(-1, t[:, 1:, None]).mean()

    imp = taylor_importance(model, losses())
    for scores in imp.heads.values():
        assert scores[planted_head] == 0 and (scores[[0, 2, 3]] > 0).all()
    attns = [m for m in model.modules() if hasattr(m, "out_proj")]
    ffns = [m for m in model.modules() if hasattr(m, "fc1")]
    # per head: its rows of q and k (Share-KV: no v) with biases, its out_proj columns, and the encoder's W_G row
    head_round = sum(2 * m.head_dim * 33 + m.head_dim * 32 for m in attns) + (64 + 1)
    target = count_params(model) - head_round - 2 * len(ffns) * 65
    plan = plan_pruning(model, imp, target)
    assert all(kept == [0, 2, 3] for kept in plan.heads.values())
    assert all(set(kept).isdisjoint(planted_channels) and len(kept) == 62 for kept in plan.ffn.values())
    assert plan.params == target


def test_unreachable_target_and_other_families_are_refused():
    model = _model()
    with pytest.raises(PruneError, match="leave"):
        plan_pruning(model, _random_importance(model), min_params(model) - 1)
    labert = create_model("labert-test", vocab_size=20, feature_dim=16)
    with pytest.raises(PruneError, match="family"):
        min_params(labert)


def test_pruned_cfg_round_trips_and_keeps_paper_configs():
    model = _model(heads=4)
    plan = plan_pruning(model, _random_importance(model), count_params(model) - 2500)
    cfg = pruned_cfg(model, plan)
    again = type(cfg).from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    rebuilt = create_model(
        "acort-test",
        vocab_size=RADIX + 3,
        feature_dim=16,
        **{k: getattr(cfg, k) for k in ("radix_base", "heads", "d_head", "enc_d_ff", "dec_d_ff")},
    )
    assert count_params(rebuilt) == plan.params


@pytest.mark.slow
def test_pruned_run_loads_exports_and_decodes(tiny_parent_run, tmp_path):
    from edgecap.workshop.compression.prune_run import prune_run
    from edgecap.workshop.export.onnx import export_onnx
    from edgecap.workshop.runs import load_run

    parent = load_run(tiny_parent_run)
    before = count_params(parent.model)
    out = prune_run(
        tiny_parent_run, tmp_path / "pruned", before - 3000, finetune_epochs=1, max_steps=2, say=lambda _: None
    )
    config = json.loads((out / "config.json").read_text())
    record = config["compression"][-1]
    assert record["kind"] == "pruning" and record["parent"] == str(tiny_parent_run.resolve())
    assert record["from_params"] == before and record["to_params"] <= before - 3000
    run = load_run(out)
    assert count_params(run.model) == record["to_params"] == config["model"]["parameters"]
    result = export_onnx(run.model, name="acort-test", precisions=("fp32",))
    assert result.parity_passed is True
    from edgecap.workshop.compression.prune_finetune import load_run_data
    from edgecap.workshop.torch_runtime.captioning import caption_bank

    data = load_run_data(run.config, run.vocab)
    captions = caption_bank(run.model, data.val_bank, run.vocab, beam_size=2, max_words=5)
    assert len(captions) == len(data.val_bank) and all(isinstance(c, str) for c in captions)
