"""TorchStepModel and TorchRuntime on a toy CaptionModel: end-to-end beam search, select semantics, parity."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from edgecap.runtime.backends import RuntimeStepModel
from edgecap.runtime.decoding import DecodeCfg, DecodeInputError, RadixSpec, beam_search, decode, greedy
from edgecap.workshop import models
from edgecap.workshop.torch_runtime.runtime import TorchRuntime, TorchStepModel

VOCAB, FEAT, HIDDEN = 10, 6, 16
PAD, BOS, EOS = 0, 1, 2
STATE = ("memory", "mask", "h", "cache")


class ToyCaptioner(nn.Module):
    """A small recurrent CaptionModel (docs/contracts.md): cross-attention over features, a growing step cache."""

    def __init__(self) -> None:
        super().__init__()
        self.vocab_size = VOCAB
        self.proj = nn.Linear(FEAT + 4, HIDDEN)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.cell = nn.GRUCell(HIDDEN, HIDDEN)
        self.query = nn.Linear(HIDDEN, HIDDEN)
        self.out = nn.Linear(2 * HIDDEN, VOCAB)

    def encode(self, features: Tensor, boxes: Tensor, feature_mask: Tensor | None) -> dict[str, Tensor]:
        memory = self.proj(torch.cat([features, boxes], dim=-1))
        if feature_mask is None:
            feature_mask = torch.ones(memory.shape[:2], dtype=torch.bool, device=memory.device)
        weights = feature_mask[..., None].to(memory.dtype)
        pooled = (memory * weights).sum(1) / weights.sum(1).clamp_min(1)
        cache = memory.new_zeros(memory.shape[0], 0, HIDDEN)
        return {"memory": memory, "mask": feature_mask, "h": torch.tanh(pooled), "cache": cache}

    def step(self, tokens: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        h = self.cell(self.embed(tokens), state["h"])
        cache = torch.cat([state["cache"], h[:, None]], dim=1)
        scores = (state["memory"] @ self.query(h)[:, :, None])[..., 0].masked_fill(~state["mask"], -1e9)
        context = (scores.softmax(-1)[..., None] * state["memory"]).sum(1) + cache.mean(1)
        logprobs = torch.log_softmax(self.out(torch.cat([context, h], dim=-1)), dim=-1)
        return logprobs, {**state, "h": h, "cache": cache}

    def forward(self, features: Tensor, boxes: Tensor, feature_mask: Tensor | None, tokens: Tensor) -> Tensor:
        state = self.encode(features, boxes, feature_mask)
        out = []
        for t in range(tokens.shape[1]):
            lp, state = self.step(tokens[:, t], state)
            out.append(lp)
        return torch.stack(out, dim=1)


def make_inputs(batch: int = 3, regions: int = 5, seed: int = 0) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, regions, dtype=torch.bool)
    mask[0, -2:] = False  # padded regions in the first image
    corner, size = (
        torch.rand(batch, regions, 2, generator=g) * 0.5,
        torch.rand(batch, regions, 2, generator=g) * 0.5 + 0.01,
    )
    return {
        "features": torch.randn(batch, regions, FEAT, generator=g),
        "boxes": torch.cat([corner, corner + size], dim=-1),
        "feature_mask": mask,
    }


@pytest.fixture(scope="module")
def model() -> ToyCaptioner:
    torch.manual_seed(0)
    return ToyCaptioner()


CFG = DecodeCfg(beam_size=3, n_best=3, max_len=6, pad_id=PAD, bos_id=BOS, eos_id=EOS)


def rescore(
    model: nn.Module,
    inputs: dict[str, Tensor],
    image: int,
    tokens: list[int],
    finished: bool,
    bos: int = BOS,
    eos: int = EOS,
) -> float:
    """Teacher-forced log-prob of one hypothesis (+ EOS when finished) with ``model.forward``."""
    targets = [*tokens, *([eos] if finished else [])]
    feed = torch.tensor([[bos, *targets[:-1]]])
    one = {k: v[image : image + 1] for k, v in inputs.items()}
    with torch.no_grad():
        lp = model(one["features"], one["boxes"], one.get("feature_mask"), feed)[0]
    return float(sum(lp[t, tok] for t, tok in enumerate(targets)))


def test_beam_search_scores_match_teacher_forced_rescoring(model: ToyCaptioner) -> None:
    inputs = make_inputs()
    results = beam_search(TorchStepModel(model), inputs, CFG)
    assert len(results) == 3
    for image, hyps in enumerate(results):
        assert len(hyps) == 3
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            assert all(t not in (PAD, BOS, EOS) for t in h.tokens)
            assert h.score == pytest.approx(rescore(model, inputs, image, h.tokens, h.finished), abs=1e-4)


def test_wide_beam_is_exhaustive_on_the_toy_model(model: ToyCaptioner) -> None:
    # 7 word tokens, max_len 2: 49 live prefixes at most, so K = 49 must return the true best sequence.
    inputs = make_inputs(batch=2)
    cfg = CFG.replace(beam_size=49, n_best=1, max_len=2)
    results = beam_search(TorchStepModel(model), inputs, cfg)
    words = range(3, VOCAB)
    for image, [best] in enumerate(results):
        candidates = (
            [([], True)] + [([w], True) for w in words] + [(list(s), False) for s in itertools.product(words, repeat=2)]
        )
        scores = [rescore(model, inputs, image, t, f) for t, f in candidates]
        top = max(range(len(scores)), key=scores.__getitem__)
        assert (best.tokens, best.finished) == candidates[top]
        assert best.score == pytest.approx(scores[top], abs=1e-4)


def test_beam_one_equals_greedy(model: ToyCaptioner) -> None:
    step_model = TorchStepModel(model)
    inputs = make_inputs(batch=4, seed=3)
    beam = beam_search(step_model, inputs, CFG.replace(beam_size=1, n_best=1, max_len=8))
    gr = greedy(step_model, inputs, CFG.replace(max_len=8))
    assert [b[0].tokens for b in beam] == [g[0].tokens for g in gr]
    assert [b[0].score for b in beam] == pytest.approx([g[0].score for g in gr], abs=1e-5)


def test_batch_equals_single_images(model: ToyCaptioner) -> None:
    step_model = TorchStepModel(model)
    inputs = make_inputs()
    batched = decode(step_model, inputs, CFG)
    for image in range(3):
        alone = decode(step_model, {k: v[image : image + 1] for k, v in inputs.items()}, CFG)[0]
        assert [h.tokens for h in batched[image]] == [h.tokens for h in alone]
        assert [h.score for h in batched[image]] == pytest.approx([h.score for h in alone], abs=1e-5)


def test_select_gathers_every_state_tensor_on_its_device(model: ToyCaptioner) -> None:
    step_model = TorchStepModel(model)
    state = step_model.encode(make_inputs())
    _, state = step_model.step(np.full(3, BOS, dtype=np.int64), state)
    index = np.array([2, 2, 0, 1], dtype=np.int64)
    picked = step_model.select(state, index)
    assert set(picked) == set(STATE)
    for name in STATE:
        assert picked[name].shape[0] == 4
        assert torch.equal(picked[name], state[name][torch.from_numpy(index)])
        assert picked[name].device == state[name].device
    assert picked["cache"].shape[1] == 1


def test_missing_inputs_are_named(model: ToyCaptioner) -> None:
    with pytest.raises(DecodeInputError, match="missing \\['boxes'\\]"):
        TorchStepModel(model).encode({"features": torch.zeros(1, 2, FEAT)})
    with pytest.raises(DecodeInputError, match="unknown \\['mask'\\]"):
        TorchStepModel(model).encode({**make_inputs(), "mask": torch.ones(3, 5)})


def test_feature_mask_is_optional(model: ToyCaptioner) -> None:
    inputs = make_inputs()
    inputs.pop("feature_mask")
    assert len(greedy(TorchStepModel(model), inputs, CFG)) == 3


def test_bfloat16_autocast_runs_on_cpu(model: ToyCaptioner) -> None:
    out = greedy(TorchStepModel(model, autocast=torch.bfloat16), make_inputs(), CFG)
    assert all(math.isfinite(h[0].score) for h in out)


class EncoderGraph(nn.Module):
    def __init__(self, model: ToyCaptioner) -> None:
        super().__init__()
        self.model = model

    def forward(self, features: Tensor, boxes: Tensor, feature_mask: Tensor) -> tuple[Tensor, ...]:
        state = self.model.encode(features, boxes, feature_mask)
        return tuple(state[n] for n in STATE)


class StepGraph(nn.Module):
    def __init__(self, model: ToyCaptioner) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, *states: Tensor) -> tuple[Tensor, ...]:
        lp, state = self.model.step(tokens, dict(zip(STATE, states, strict=True)))
        return (lp, *(state[n] for n in STATE))


def torch_runtimes(model: ToyCaptioner, device: str = "cpu") -> RuntimeStepModel:
    encoder = TorchRuntime(
        EncoderGraph(model),
        {
            "features": ("float32", ("batch", "regions", FEAT)),
            "boxes": ("float32", ("batch", "regions", 4)),
            "feature_mask": ("bool", ("batch", "regions")),
        },
        list(STATE),
        device=device,
        name="encoder",
    )
    step_inputs = {
        "tokens": ("int64", ("batch",)),
        "memory": ("float32", ("batch", "regions", HIDDEN)),
        "mask": ("bool", ("batch", "regions")),
        "h": ("float32", ("batch", HIDDEN)),
        "cache": ("float32", ("batch", "past", HIDDEN)),
    }
    outputs = ["logprobs", *(f"{n}_out" for n in STATE)]
    step = TorchRuntime(StepGraph(model), step_inputs, outputs, device=device, name="step")
    return RuntimeStepModel(encoder, step, STATE)


def test_runtime_bridge_over_torch_graphs_matches_torch_step_model(model: ToyCaptioner) -> None:
    inputs = make_inputs()
    expected = beam_search(TorchStepModel(model), inputs, CFG)
    with torch_runtimes(model) as bridged:
        got = beam_search(bridged, inputs, CFG)
        assert bridged.step_runtime.last_latency_s is not None
    assert [[h.tokens for h in r] for r in got] == [[h.tokens for h in r] for r in expected]
    assert [[h.score for h in r] for r in got] == [pytest.approx([h.score for h in r], abs=1e-6) for r in expected]


class TwoOutputs(nn.Module):
    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x, x + 1


def test_torch_runtime_output_count_mismatch_is_reported() -> None:
    rt = TorchRuntime(TwoOutputs(), {"x": ("float32", (None,))}, ["only_one"])
    with rt, pytest.raises(ValueError, match="returned 2 outputs"):
        rt.infer({"x": torch.zeros(3)})
    with TorchRuntime(TwoOutputs(), {"x": ("float32", (None,))}, ["a", "b"]) as ok:
        out = ok.infer({"x": torch.zeros(3)})
        assert out["b"].tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="output_names"):
        TorchRuntime(nn.Identity(), {}, [])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_cuda_matches_cpu(model: ToyCaptioner) -> None:
    inputs = make_inputs()
    cpu = beam_search(TorchStepModel(model, "cpu"), inputs, CFG)
    cuda = beam_search(TorchStepModel(model, "cuda"), inputs, CFG)
    model.to("cpu")
    assert [[h.tokens for h in r] for r in cuda] == [[h.tokens for h in r] for r in cpu]
    with torch_runtimes(model, "cuda") as bridged:
        assert [[h.tokens for h in r] for r in beam_search(bridged, inputs, CFG)] == [
            [h.tokens for h in r] for r in cpu
        ]
    model.to("cpu")


def test_cuda_request_without_gpu_is_a_clear_error(model: ToyCaptioner) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="cuda"):
        TorchStepModel(model, "cuda")


@pytest.mark.parametrize("name", ["acort-test", "ort-test"])
def test_registered_model_beam_matches_teacher_forced_rescoring(name: str) -> None:
    """Beam search through TorchStepModel over a real tiny model equals re-scoring its hypotheses with ``forward``."""
    torch.manual_seed(0)
    probe = models.get_model_cfg(name)
    if probe.vocab_kind == "radix":  # radix: PAD 0, digits 1..7, BOS 8, EOS 9; 40 words in 2 digits
        net = models.create_model(name, vocab_size=VOCAB, feature_dim=FEAT, radix_base=VOCAB - 3)
        cfg = DecodeCfg(beam_size=3, n_best=3, max_len=6, pad_id=0, bos_id=8, eos_id=9, radix=RadixSpec(7, 2, 40))
    else:
        net = models.create_model(name, vocab_size=VOCAB, feature_dim=FEAT)
        cfg = CFG
    net.eval()
    inputs = make_inputs()
    results = beam_search(TorchStepModel(net), inputs, cfg)
    for image, hyps in enumerate(results):
        assert len(hyps) == 3
        for h in hyps:
            expected = rescore(net, inputs, image, h.tokens, h.finished, bos=cfg.bos_id, eos=cfg.eos_id)
            assert h.score == pytest.approx(expected, abs=1e-4)
