"""PrefixRerunStepModel (no cache, whole prefix every step) decodes exactly what the cached TorchStepModel decodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from edgecap.runtime.decoding import DecodeCfg, DecodeInputError, RadixSpec, decode
from edgecap.workshop.models import ModelInputError, create_model
from edgecap.workshop.torch_runtime.prefix import PREFIX_STATE, PrefixRerunStepModel
from edgecap.workshop.torch_runtime.runtime import TorchStepModel

FEAT, REGIONS, BATCH = 16, 6, 3
WORD_VOCAB = 40  # PAD 0, BOS 1, EOS 2, UNK 3, 36 words
RADIX_BASE = 16  # PAD 0, digits 1..16, BOS 17, EOS 18; 200 words in 2 digits

CASES = {
    "acort-test": (
        {"vocab_size": RADIX_BASE + 3, "radix_base": RADIX_BASE},
        DecodeCfg(
            max_len=8, pad_id=0, bos_id=RADIX_BASE + 1, eos_id=RADIX_BASE + 2, radix=RadixSpec(RADIX_BASE, 2, 200)
        ),
    ),
    "ort-test": ({"vocab_size": WORD_VOCAB}, DecodeCfg(max_len=8, pad_id=0, bos_id=1, eos_id=2)),
    # length-controllable (LaBERT §3.1): the level rides in the rerun state and reaches every decode_full
    "expansionnet-test-len": (
        {"vocab_size": WORD_VOCAB},
        DecodeCfg(max_len=8, pad_id=0, bos_id=1, eos_id=2, length_level=3),
    ),
}


def make_inputs(batch: int = BATCH, seed: int = 0) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, REGIONS, dtype=torch.bool)
    mask[0, -2:] = False  # padded regions: image 0 has 4 valid regions, image 2 has 5
    if batch > 2:
        mask[2, -1] = False
    corner = torch.rand(batch, REGIONS, 2, generator=g) * 0.5
    size = torch.rand(batch, REGIONS, 2, generator=g) * 0.5 + 0.01
    return {
        "features": torch.randn(batch, REGIONS, FEAT, generator=g),
        "boxes": torch.cat([corner, corner + size], dim=-1),
        "feature_mask": mask,
    }


def build(name: str) -> tuple[nn.Module, DecodeCfg]:
    torch.manual_seed(0)
    kwargs, cfg = CASES[name]
    model = create_model(name, feature_dim=FEAT, **kwargs)
    return model.eval(), cfg


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> tuple[str, nn.Module, DecodeCfg]:
    return (request.param, *build(request.param))


@pytest.mark.parametrize("strategy,beam,n_best", [("greedy", 1, 1), ("beam", 3, 3)])
def test_same_tokens_and_scores_as_cached_decoding(case: tuple, strategy: str, beam: int, n_best: int) -> None:
    _, model, base = case
    cfg = base.replace(strategy=strategy, beam_size=beam, n_best=n_best)
    inputs = make_inputs()
    cached = decode(TorchStepModel(model), inputs, cfg)
    rerun = decode(PrefixRerunStepModel(model), inputs, cfg)
    assert len(rerun) == BATCH
    assert [[h.tokens for h in r] for r in rerun] == [[h.tokens for h in r] for r in cached]
    assert [[h.finished for h in r] for r in rerun] == [[h.finished for h in r] for r in cached]
    for got, want in zip(rerun, cached, strict=True):
        assert len(got) == n_best
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-4)
    # Non-trivial decoding: beam search must have produced more than one distinct caption somewhere.
    if strategy == "beam":
        assert any(len({tuple(h.tokens) for h in r}) > 1 for r in rerun)


def test_forced_full_length_beam_matches(case: tuple) -> None:
    """min_len = max_len − 1 (the benchmark's setting): every step runs at B·K rows, the longest prefixes."""
    _, model, base = case
    cfg = base.replace(max_len=9, min_len=8, n_best=3)
    inputs = make_inputs()
    cached = decode(TorchStepModel(model), inputs, cfg)
    rerun = decode(PrefixRerunStepModel(model), inputs, cfg)
    assert [[h.tokens for h in r] for r in rerun] == [[h.tokens for h in r] for r in cached]
    assert all(len(h.tokens) >= 8 for r in rerun for h in r)
    for got, want in zip(rerun, cached, strict=True):
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-4)


def test_step_logprobs_match_the_cached_step(case: tuple) -> None:
    _, model, cfg = case
    inputs = make_inputs()
    expected_state = set(PREFIX_STATE)
    if model.length_levels:  # one level per image, each row decoded at its own
        inputs["length_level"] = torch.tensor([1, 4, 2])
        expected_state.add("length_level")
    cached_model, rerun_model = TorchStepModel(model), PrefixRerunStepModel(model)
    cached, rerun = cached_model.encode(inputs), rerun_model.encode(inputs)
    assert set(rerun) == expected_state
    assert rerun["prefix"].shape == (BATCH, 0) and rerun["prefix"].dtype == torch.long
    g = torch.Generator().manual_seed(1)
    tokens = np.full(BATCH, cfg.bos_id, dtype=np.int64)
    for t in range(5):
        lp_cached, cached = cached_model.step(tokens, cached)
        lp_rerun, rerun = rerun_model.step(tokens, rerun)
        assert isinstance(lp_rerun, np.ndarray) and lp_rerun.dtype == np.float32 and lp_rerun.shape == lp_cached.shape
        np.testing.assert_allclose(lp_rerun, lp_cached, atol=1e-5, rtol=1e-5)
        assert rerun["prefix"].shape == (BATCH, t + 1)
        tokens = torch.randint(3, model.vocab_size, (BATCH,), generator=g).numpy()


def test_select_gathers_every_entry_and_keeps_prefix_history() -> None:
    model, cfg = build("ort-test")
    step_model = PrefixRerunStepModel(model)
    state = step_model.encode(make_inputs())
    _, state = step_model.step(np.full(BATCH, cfg.bos_id, dtype=np.int64), state)
    _, state = step_model.step(np.array([5, 6, 7], dtype=np.int64), state)
    index = np.array([2, 2, 0, 1], dtype=np.int64)
    picked = step_model.select(state, index)
    assert set(picked) == set(PREFIX_STATE)
    for name in PREFIX_STATE:
        assert torch.equal(picked[name], state[name][torch.from_numpy(index)])
    assert picked["prefix"].tolist() == [[1, 7], [1, 7], [1, 5], [1, 6]]


def test_missing_mask_means_all_regions_valid() -> None:
    model, cfg = build("ort-test")
    inputs = make_inputs()
    inputs["feature_mask"] = torch.ones(BATCH, REGIONS, dtype=torch.bool)
    with_mask = decode(PrefixRerunStepModel(model), inputs, cfg)
    inputs.pop("feature_mask")
    state = PrefixRerunStepModel(model).encode(inputs)
    assert state["feature_mask"].dtype == torch.bool and bool(state["feature_mask"].all())
    without = decode(PrefixRerunStepModel(model), inputs, cfg)
    assert [h[0].tokens for h in without] == [h[0].tokens for h in with_mask]


def test_bad_inputs_are_named() -> None:
    model, cfg = build("ort-test")
    step_model = PrefixRerunStepModel(model)
    with pytest.raises(DecodeInputError, match=r"missing \['boxes'\]"):
        step_model.encode({"features": torch.zeros(1, 2, FEAT)})
    with pytest.raises(DecodeInputError, match=r"unknown \['mask'\]"):
        step_model.encode({**make_inputs(), "mask": torch.ones(BATCH, REGIONS, dtype=torch.bool)})
    with pytest.raises(DecodeInputError, match="prefix"):
        step_model.step(torch.zeros(BATCH, dtype=torch.long), {"memory": torch.zeros(BATCH, 2, 32)})
    with pytest.raises(TypeError, match="decode_full"):
        PrefixRerunStepModel(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="not both"):
        PrefixRerunStepModel(model, dtype=torch.float16, autocast=torch.bfloat16)


def test_prefix_longer_than_the_decoder_positions_is_refused() -> None:
    torch.manual_seed(0)
    model = create_model("ort-test", vocab_size=WORD_VOCAB, feature_dim=FEAT, max_len=3).eval()
    step_model = PrefixRerunStepModel(model)
    state = step_model.encode(make_inputs())
    for _ in range(3):
        _, state = step_model.step(torch.ones(BATCH, dtype=torch.long), state)
    with pytest.raises(ModelInputError, match="max_len=3"):
        step_model.step(torch.ones(BATCH, dtype=torch.long), state)


@pytest.mark.parametrize("name", ["acort-test", "expansionnet-test", "expansionnet-test-len"])
def test_exported_rerun_graphs_decode_like_the_cached_torch_model(name: str) -> None:
    """PrefixRerunModel exports through its family's spec (parity-checked) into graphs that re-run the prefix on
    ONNX Runtime, and the shared beam search over them finds the cached torch model's captions (at the cfg's length
    level for a length-aware model)."""
    from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model
    from edgecap.workshop.export import export_onnx
    from edgecap.workshop.torch_runtime.prefix import PrefixRerunModel

    if name == "expansionnet-test":
        torch.manual_seed(0)
        model, cfg = create_model(name, feature_dim=FEAT, vocab_size=WORD_VOCAB).eval(), CASES["ort-test"][1]
    else:
        model, cfg = build(name)
    cfg = cfg.replace(strategy="beam", beam_size=3, n_best=2)
    result = export_onnx(PrefixRerunModel(model).eval(), None, name=f"{name}-rerun", precisions=["fp32"])
    assert result.parity_passed
    levels = ("rerun_level",) if name.endswith("-len") else ()
    assert result.spec.state_names == ("rerun_memory", "rerun_mask", "prefix", *levels)
    assert result.spec.step_state_names == ("prefix",)  # memory, mask (and level) are carried, never copied out
    graphs = result.runtime_models("fp32")
    inputs = make_inputs()
    with create_onnxruntime_step_model(graphs["encoder"], graphs["step"], intra_op_threads=1) as rerun:
        on_onnxruntime = decode(rerun, inputs, cfg)
    cached = decode(TorchStepModel(model), inputs, cfg)
    assert [[h.tokens for h in r] for r in on_onnxruntime] == [[h.tokens for h in r] for r in cached]
    for got, want in zip(on_onnxruntime, cached, strict=True):
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-4)


def test_rerun_model_checks_levels_like_the_model_it_wraps() -> None:
    from edgecap.workshop.models import LengthLevelError
    from edgecap.workshop.torch_runtime.prefix import PrefixRerunModel

    memory = torch.zeros(2, REGIONS, 32)
    plain, aware = PrefixRerunModel(build("ort-test")[0]), PrefixRerunModel(build("expansionnet-test-len")[0])
    with pytest.raises(LengthLevelError, match="no length control"):
        plain.start(memory, None, torch.tensor([1, 2]))
    with pytest.raises(LengthLevelError, match="pass length_level"):
        aware.start(memory)
    with pytest.raises(LengthLevelError, match="must be in 1..4"):
        aware.start(memory, None, torch.tensor([1, 9]))
    assert aware.start(memory, None, torch.tensor([1, 4]))["rerun_level"].tolist() == [1, 4]
