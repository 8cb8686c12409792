"""2:4 sparsity: the masks are magnitude 2:4 along each weight row (K), hold exactly through fine-tuning, survive
into the exported ONNX initialisers, and the run records the step."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edgecap.workshop.compression.sparsity import (
    SparsityError,
    apply_2to4,
    check_2to4,
    finalize_2to4,
    groups_2to4,
    onnx_2to4_report,
    parse_pattern,
    sparse_layers,
    to_numpy,
)
from edgecap.workshop.models import create_model


def test_groups_2to4_reads_the_given_axis():
    w = np.array([[0, 0, 1, 2, 3, 0, 0, 4]], dtype=np.float32)
    assert groups_2to4(w, axis=1)
    assert not groups_2to4(w.T, axis=1)  # a column of one is no group of four
    assert groups_2to4(w.T, axis=0)
    assert not groups_2to4(np.array([[0, 1, 2, 3]], dtype=np.float32), axis=1)


def test_masks_zero_the_two_smallest_of_every_four_inputs():
    torch.manual_seed(0)
    model = create_model("acort-test", vocab_size=13, feature_dim=16, radix_base=10)
    before = {n: w.copy() for n, w in to_numpy(model, sparse_layers(model)).items()}
    sparsifier = apply_2to4(model)
    finalize_2to4(sparsifier)
    assert check_2to4(model) == []
    for name, w in to_numpy(model, sparse_layers(model)).items():
        groups, original = w.reshape(w.shape[0], -1, 4), np.abs(before[name]).reshape(w.shape[0], -1, 4)
        kept = groups != 0
        assert (kept.sum(-1) == 2).all()
        largest_zeroed = np.where(kept, -np.inf, original).max(-1)
        assert (largest_zeroed <= np.where(kept, original, np.inf).min(-1)).all()
    assert not any(n.endswith("geometric_bias.proj") for n in sparse_layers(model))  # W_G stays dense


def test_masks_hold_exactly_while_training():
    torch.manual_seed(0)
    model = create_model("acort-test", vocab_size=13, feature_dim=16, radix_base=10).train()
    sparsifier = apply_2to4(model)
    start = {n: w.copy() for n, w in to_numpy(model, sparse_layers(model)).items()}
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        xy = torch.rand(2, 4, 2, generator=g) * 0.5
        boxes = torch.cat((xy, xy + 0.2), dim=-1)
        tokens = torch.randint(1, 13, (2, 6), generator=g)
        logp = model(torch.randn(2, 4, 16, generator=g), boxes, None, tokens[:, :-1])
        loss = -logp.gather(-1, tokens[:, 1:, None]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert check_2to4(model) == []
    finalize_2to4(sparsifier)
    assert check_2to4(model) == []
    after = to_numpy(model, sparse_layers(model))
    assert all(((after[n] == 0) == (start[n] == 0)).all() for n in after)  # the same masks throughout
    assert any(not np.array_equal(after[n], start[n]) for n in after)  # while the kept weights trained
    assert not any("parametrizations" in k for k in model.state_dict())


def test_bad_pattern_is_refused():
    with pytest.raises(SparsityError, match="2:4"):
        parse_pattern("4:8")


@pytest.mark.slow
def test_sparse_run_holds_its_masks_through_finetuning_and_export(tiny_parent_run, tmp_path):
    from edgecap.workshop.compression.prune_run import sparsify_run
    from edgecap.workshop.export.onnx import export_onnx
    from edgecap.workshop.runs import load_run

    parent = load_run(tiny_parent_run)
    out = sparsify_run(tiny_parent_run, tmp_path / "sparse", "2:4", finetune_epochs=1, max_steps=3, say=lambda _: None)
    run = load_run(out)
    names = sparse_layers(run.model)
    assert check_2to4(run.model) == []
    moved = to_numpy(run.model, names)
    assert names == sparse_layers(parent.model)
    record = json.loads((out / "config.json").read_text())["compression"][-1]
    assert record["kind"] == "sparsity" and record["pattern"] == "2:4" and record["layers"] == len(names)
    assert record["parent"] == str(tiny_parent_run.resolve()) and record["fraction"] == 0.5
    result = export_onnx(run.model, name="acort-test", precisions=("fp32",))
    reports = [onnx_2to4_report(result.model(g, "fp32"), moved) for g in result.spec.graph_names]
    for name in names:  # every masked weight is in some graph, and 2:4 along K wherever it is
        statuses = {r[name] for r in reports}
        assert "ok" in statuses and "broken" not in statuses, (name, statuses)
