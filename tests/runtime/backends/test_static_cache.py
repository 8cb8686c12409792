"""The static-shape decoder step on CPU: it must decode exactly what the eager step decodes (the CUDA-graph and
compiled modes replay this same step, see ``tests/gpu/test_cuda_graph.py``), and refuse what it cannot run."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch

from edgecap.runtime.decoding import DecodeCfg, decode
from edgecap.runtime.decoding.protocol import DecodeInputError
from edgecap.workshop.models import create_model
from edgecap.workshop.torch_runtime.runtime import TorchStepModel
from edgecap.workshop.torch_runtime.static_cache import (
    StaticLayout,
    StepModeError,
    padded_index,
    plan_layout,
    resolve_step_mode,
    static_step_supported,
)

VOCAB = 40
CPU = torch.device("cpu")


def _setup(name: str, batch: int = 5, seed: int = 0) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    vocab = 771 if name.startswith("acort") else VOCAB
    model = create_model(name, vocab_size=vocab, feature_dim=12).eval()
    g = torch.Generator().manual_seed(seed)
    regions = 6
    mask = torch.ones(batch, regions, dtype=torch.bool)
    mask[0, 4:] = False  # padding regions take the masked path too
    inputs = {
        "features": torch.randn(batch, regions, 12, generator=g),
        "boxes": torch.rand(batch, regions, 4, generator=g).sort(-1).values,
        "feature_mask": mask,
    }
    return model, inputs


def _cfg(model: torch.nn.Module, **kw: object) -> DecodeCfg:
    vocab = model.vocab_size
    base = {"pad_id": 0, "bos_id": vocab - 2, "eos_id": vocab - 1, "max_len": 14, "beam_size": 3}
    if getattr(model, "length_levels", None):
        base["length_level"] = 2
    return DecodeCfg(**{**base, **kw})


def _run(step_model: TorchStepModel, inputs: dict, cfg: DecodeCfg) -> tuple[list, list]:
    hyps = decode(step_model, inputs, cfg)
    return [[h.tokens for h in hs] for hs in hyps], [[h.score for h in hs] for hs in hyps]


@pytest.mark.parametrize("name", ["acort-test", "ort-test", "acort-test-qk", "acort-test-len"])
@pytest.mark.parametrize("beam", [1, 3])
def test_static_step_decodes_what_the_eager_step_decodes(name: str, beam: int) -> None:
    model, inputs = _setup(name)
    cfg = _cfg(model, beam_size=beam, strategy="greedy" if beam == 1 else "beam")
    eager_tokens, eager_scores = _run(TorchStepModel(model, "cpu"), inputs, cfg)
    static = TorchStepModel(model, "cpu", step_mode="static")
    tokens, scores = _run(static, inputs, cfg)
    assert tokens == eager_tokens
    np.testing.assert_allclose(np.array(scores), np.array(eager_scores), rtol=1e-5, atol=1e-5)
    assert _run(static, inputs, cfg)[0] == eager_tokens  # a reused workspace decodes the same


def test_pruning_and_new_batch_sizes_reuse_fixed_shapes() -> None:
    model, inputs = _setup("acort-test", batch=7)
    static = TorchStepModel(model, "cpu", step_mode="static")
    for prune in (True, False):
        cfg = _cfg(model, prune_finished=prune, max_len=20)
        for rows in (7, 3, 1):
            part = {k: v[:rows] for k, v in inputs.items()}
            assert _run(static, part, cfg)[0] == _run(TorchStepModel(model, "cpu"), part, cfg)[0]
    capacities = sorted(key[0] for key in static._static._workspaces())
    assert capacities == [1, 3, 7, 9, 21]  # B and B·K per batch size (3 serves both), whatever pruning did


def test_a_state_from_another_decode_is_refused() -> None:
    model, inputs = _setup("acort-test", batch=2)
    static = TorchStepModel(model, "cpu", step_mode="static")
    old = static.encode(inputs)
    static.encode(inputs)  # a second decode on this thread takes the workspace over
    with pytest.raises(DecodeInputError, match="current decode"):
        static.step(np.zeros(2, dtype=np.int64), old)


def test_decoding_past_max_len_is_refused() -> None:
    model, inputs = _setup("acort-test", batch=1)
    static = TorchStepModel(model, "cpu", step_mode="static")
    state = static.encode(inputs)
    for _ in range(model.max_len):
        _, state = static.step(np.zeros(1, dtype=np.int64), state)
    with pytest.raises(ValueError, match="past max_len"):
        static.step(np.zeros(1, dtype=np.int64), state)


def test_threads_decode_concurrently_on_their_own_workspaces() -> None:
    model, inputs = _setup("acort-test", batch=4)
    cfg = _cfg(model)
    static = TorchStepModel(model, "cpu", step_mode="static")
    expected = _run(TorchStepModel(model, "cpu"), inputs, cfg)[0]
    results: list[object] = []

    def work() -> None:
        for _ in range(3):
            results.append(_run(static, inputs, cfg)[0])

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 9


def test_layout_extends_growing_caches_to_max_len() -> None:
    state = {
        "memory_bias": torch.zeros(2, 1, 1, 6),
        "cross_k": torch.zeros(2, 1, 2, 6, 16),
        "self_k": torch.zeros(2, 2, 2, 0, 16, dtype=torch.float16),
    }
    layout = plan_layout(state, capacity=6, max_len=31)
    shapes = {name: (shape, dtype) for name, shape, dtype in layout.entries}
    assert shapes["self_k"] == ((6, 2, 2, 31, 16), torch.float16)
    assert shapes["cross_k"] == ((6, 1, 2, 6, 16), torch.float32)
    assert layout.nbytes() == 6 * 6 * 4 + 6 * 2 * 6 * 16 * 4 + 6 * 2 * 2 * 31 * 16 * 2
    assert isinstance(layout, StaticLayout) and layout.key == plan_layout(state, 6, 31).key
    with pytest.raises(DecodeInputError, match="empty"):
        plan_layout({"self_k": torch.zeros(2, 2, 2, 3, 16)}, capacity=2, max_len=31)
    with pytest.raises(ValueError, match="capacity"):
        plan_layout(state, capacity=0, max_len=31)


def test_padded_index_fills_with_row_zero() -> None:
    assert padded_index(np.array([2, 1]), 4).tolist() == [2, 1, 0, 0]
    with pytest.raises(ValueError, match="capacity 1"):
        padded_index(np.array([0, 0]), 1)


def test_step_modes_are_resolved_or_refused_with_the_alternative() -> None:
    acort, _ = _setup("acort-test")
    expansion = create_model("expansionnet-test", vocab_size=VOCAB, feature_dim=12)
    assert resolve_step_mode("auto", CPU, acort) == "eager"
    assert resolve_step_mode("auto", torch.device("cuda"), acort) == "cuda-graph"
    assert resolve_step_mode("auto", torch.device("cuda"), expansion) == "eager"
    assert resolve_step_mode("static", CPU, acort) == "static"
    assert resolve_step_mode("eager", CPU, expansion) == "eager"
    with pytest.raises(StepModeError, match="step_mode='static' runs the same"):
        resolve_step_mode("cuda-graph", CPU, acort)
    with pytest.raises(StepModeError, match="family has no static-cache step"):
        resolve_step_mode("static", CPU, expansion)
    with pytest.raises(StepModeError, match="one of"):
        resolve_step_mode("graph", CPU, acort)
    assert static_step_supported(acort) == (True, "")


def test_cuda_graph_without_cuda_is_refused_by_the_adapter() -> None:
    model, _ = _setup("acort-test")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the refusal is for CPU-only machines")
    with pytest.raises(ValueError, match="cuda"):
        TorchStepModel(model, "cuda", step_mode="cuda-graph")
    with pytest.raises(StepModeError, match="needs a CUDA device"):
        TorchStepModel(model, "cpu", step_mode="cuda-graph")


def test_bf16_static_step_matches_bf16_eager() -> None:
    model, inputs = _setup("acort-test")
    cfg = dataclasses.replace(_cfg(model), max_len=10)
    eager = _run(TorchStepModel(model, "cpu", dtype=torch.bfloat16), inputs, cfg)[0]
    model, _ = _setup("acort-test")
    static = _run(TorchStepModel(model, "cpu", dtype=torch.bfloat16, step_mode="static"), inputs, cfg)[0]
    agree = sum(a == b for a, b in zip(static, eager, strict=True))
    assert agree >= len(eager) - 1  # bf16 sums over 10 vs t+1 keys may flip a near-tie
