"""The optimised search returns exactly what the previous implementation returned (``_reference_search.py``).

Randomised over many seeds: beam / greedy / sampling, batch sizes, beam widths wider than the vocabulary, min length,
forbidden tokens, n-gram blocking, radix constraints of 1–3 digits, length penalties, pruning on and off, and step
models with tied log-probs, NaN / +inf at always-banned tokens and float16 / float64 outputs. Every hypothesis must
match bit for bit (tokens, score, per-token log-probs, finished flag; floats compared by ``repr``, so even a signed
zero counts), and so must the tokens fed to the model at every step. The step models return the array type of
``fakes.BACKEND`` to the numpy search (the reference always gets torch tensors).
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from edgecap.runtime.decoding import DecodeCfg, RadixConstraint, RadixSpec, beam_search, greedy, sample
from edgecap.runtime.decoding.arrays import to_numpy
from edgecap.runtime.decoding.processors import ProcessorPlan, StepContext, apply_processors, build_processors
from tests.runtime.decoding import _reference_search as ref
from tests.runtime.decoding.fakes import as_backend, check_index


class HashedStepModel:
    """Log-probs drawn per (image, prefix) from a seeded generator, with knobs for the awkward cases.

    Args:
        images: number of images.
        vocab_size: V.
        seed: varies every distribution.
        sharpness: scale of the logits (high: peaked, beams rarely reorder).
        quantum: round logits to this grid (> 0 makes tied log-probs common).
        eos_id, eos_boost: add ``eos_boost`` to EOS's logit, so hypotheses finish at varied steps.
        poison: token -> value written into its log-prob after normalising (NaN, +inf; use always-banned tokens).
        dtype: numpy dtype of the returned log-probs.

    Serves both searches: called with torch tokens (the reference) it returns torch log-probs; called with numpy
    tokens (the search under test) it checks they are int64 and returns ``fakes.BACKEND`` arrays.
    """

    def __init__(
        self,
        images: int,
        vocab_size: int,
        seed: int,
        *,
        sharpness: float = 2.0,
        quantum: float = 0.0,
        eos_id: int = 2,
        eos_boost: float = 0.0,
        poison: Mapping[int, float] | None = None,
        dtype: Any = np.float32,
    ) -> None:
        self.images, self.vocab_size, self.seed = images, vocab_size, seed
        self.sharpness, self.quantum, self.eos_id, self.eos_boost = sharpness, quantum, eos_id, eos_boost
        self.poison = dict(poison or {})
        self.dtype = dtype
        self.fed: list[list[int]] = []
        self.selects = 0

    def inputs(self) -> dict[str, Any]:
        return {"image": as_backend(np.arange(self.images, dtype=np.int64))}

    def encode(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        image = to_numpy(inputs["image"], np.int64)
        return {"image": image, "prefix": np.empty((image.shape[0], 0), dtype=np.int64)}

    def _row(self, image: int, prefix: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng(zlib.crc32(repr((self.seed, image, prefix)).encode()))
        logits = rng.standard_normal(self.vocab_size) * self.sharpness
        if self.quantum:
            logits = np.round(logits / self.quantum) * self.quantum
        logits[self.eos_id] += self.eos_boost
        row = logits - logits.max()
        row = row - np.log(np.exp(row).sum())
        for token, value in self.poison.items():
            row[token] = value
        return row

    def step(self, tokens: Any, state: dict[str, np.ndarray]) -> tuple[Any, dict[str, np.ndarray]]:
        reference = isinstance(tokens, Tensor)
        host = tokens.numpy() if reference else check_index(tokens, "step tokens")
        self.fed.append(host.tolist())
        prefix = np.concatenate([state["prefix"], host[:, None]], axis=1)
        rows = [self._row(i, tuple(p[1:])) for i, p in zip(state["image"].tolist(), prefix.tolist(), strict=True)]
        logprobs = np.stack(rows).astype(self.dtype)
        out = torch.from_numpy(logprobs) if reference else as_backend(logprobs)
        return out, {"image": state["image"], "prefix": prefix}

    def select(self, state: dict[str, np.ndarray], index: Any) -> dict[str, np.ndarray]:
        self.selects += 1
        rows = index.numpy() if isinstance(index, Tensor) else check_index(index, "select index")
        return {name: value[rows] for name, value in state.items()}


class _OnTorch:
    """A numpy processor as the torch reference calls it (in place on the tensor's memory, like a torch one)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, logprobs: Tensor, ctx: StepContext) -> Tensor:
        out = self.processor(logprobs.numpy(), StepContext(ctx.step, ctx.max_len, ctx.tokens.numpy()))
        return torch.from_numpy(out)


def _reference(model: Any, cfg: DecodeCfg, processors: Sequence[Any] | None = None) -> list[list[Any]]:
    procs = None if processors is None else [_OnTorch(p) for p in processors]
    inputs = {"image": torch.arange(model.images)}
    if cfg.strategy == "beam":
        return ref.beam_search(model, inputs, cfg, procs)
    if cfg.strategy == "greedy":
        return ref.decode_rows(model, inputs, cfg, ref.GreedySearch(), 1, procs)
    search = ref.Sampling(cfg.temperature, cfg.top_k, cfg.seed)
    return ref.decode_rows(model, inputs, cfg, search, cfg.num_samples, procs)


def _new(model: Any, cfg: DecodeCfg, processors: Sequence[Any] | None = None) -> list[list[Any]]:
    fn = {"beam": beam_search, "greedy": greedy, "sample": sample}[cfg.strategy]
    return fn(model, model.inputs(), cfg, processors)


def _exact(result: list[list[Any]]) -> list[list[tuple[str, str, str, bool]]]:
    """Hypotheses with every float as its repr (distinct bits -> distinct strings, -0.0 included)."""
    return [[(repr(h.tokens), repr(h.score), repr(h.logprobs), h.finished) for h in hyps] for hyps in result]


def _assert_same(make_model: Any, cfg: DecodeCfg, processors: Sequence[Any] | None = None) -> None:
    old_model, new_model = make_model(), make_model()
    try:
        expected = _exact(_reference(old_model, cfg, processors))
    except RuntimeError as exc:
        # The old sampler indexed past V when a row had no legal token (e.g. a finished row fed PAD after EOS, under
        # a radix constraint); the new one draws the last token there with log-prob -inf.
        assert cfg.strategy == "sample" and "out of bounds" in str(exc)
        result = _new(new_model, cfg, processors)
        assert [len(hyps) for hyps in result] == [cfg.num_samples] * new_model.images
        return
    got = _exact(_new(new_model, cfg, processors))
    assert got == expected, cfg
    assert new_model.fed == old_model.fed, cfg


def _random_case(rng: random.Random) -> tuple[Any, DecodeCfg]:
    """One random (model factory, cfg) pair."""
    radix = None
    if rng.random() < 0.4:
        base, digits = rng.choice([(3, 1), (4, 2), (3, 2), (2, 3), (5, 2)])
        words = rng.randint(1, base**digits)
        radix = RadixSpec(base, digits, words, allow_unk=rng.random() < 0.7)
        vocab, pad, bos, eos = base + 3, 0, base + 1, base + 2
    else:
        vocab, pad, bos, eos = rng.randint(4, 12), 0, 1, 2
    max_len = rng.randint(1, 8)
    strategy = rng.choice(["beam", "beam", "beam", "greedy", "sample"])
    beam_size = rng.randint(1, 6)
    forbid = tuple(t for t in range(3, vocab) if t != eos and rng.random() < 0.1) if radix is None else ()
    cfg = DecodeCfg(
        strategy=strategy,
        max_len=max_len,
        min_len=rng.randint(0, max_len - 1) if rng.random() < 0.4 else 0,
        beam_size=beam_size,
        n_best=rng.randint(1, beam_size),
        length_penalty=rng.choice(["none", "none", "wu", "avg"]),
        length_penalty_alpha=rng.choice([0.0, 0.5, 1.0, 2.0]),
        num_samples=rng.randint(1, 4),
        temperature=rng.choice([1.0, 0.7, 1.5]),
        top_k=rng.choice([0, 0, 2, 3]),
        seed=rng.randint(0, 10**6),
        no_repeat_ngram=rng.choice([0, 0, 0, 1, 2]),
        forbid_tokens=forbid,
        pad_id=pad,
        bos_id=bos,
        eos_id=eos,
        radix=radix,
        prune_finished=rng.random() < 0.5,
    )
    model_kw: dict[str, Any] = {
        "images": rng.randint(1, 4),
        "vocab_size": vocab,
        "seed": rng.randint(0, 10**6),
        "sharpness": rng.choice([0.5, 2.0, 6.0]),
        "quantum": rng.choice([0.0, 0.0, 0.5, 2.0]),
        "eos_id": eos,
        "eos_boost": rng.choice([0.0, 1.0, 3.0]),
    }
    if rng.random() < 0.2:  # garbage the mask hides: NaN / +inf at PAD and BOS, which are always banned
        model_kw["poison"] = {pad: math.nan, bos: rng.choice([math.inf, math.nan])}
    if rng.random() < 0.2:
        model_kw["dtype"] = rng.choice([np.float16, np.float64])
    return (lambda: HashedStepModel(**model_kw)), cfg


@pytest.mark.parametrize("chunk", range(4))
def test_matches_the_previous_implementation_on_random_cases(chunk: int) -> None:
    rng = random.Random(1000 + chunk)
    for _ in range(50):
        make_model, cfg = _random_case(rng)
        _assert_same(make_model, cfg)


def test_matches_on_the_edge_setting_forced_and_natural() -> None:
    # The benchmarked setting: radix 771 classes (one base-768 digit, 121 words), beam 3, forced 20 steps; and the
    # same with EOS allowed throughout (beams finish at many different steps).
    spec = RadixSpec(768, 1, 121)
    for batch, forced in ((1, True), (3, True), (3, False)):
        cfg = DecodeCfg(pad_id=0, bos_id=769, eos_id=770, radix=spec, beam_size=3, max_len=20)
        cfg = cfg.replace(min_len=19) if forced else cfg
        _assert_same(lambda b=batch: HashedStepModel(b, 771, seed=5, eos_id=770, eos_boost=4.0), cfg)


@pytest.mark.parametrize("strategy", ["beam", "greedy", "sample"])
@pytest.mark.parametrize("poison", [{0: math.nan}, {1: math.inf}, {0: math.nan, 1: -math.nan}])
def test_matches_when_banned_tokens_hold_nan_or_inf(strategy: str, poison: dict[int, float]) -> None:
    # The fast paths mask by adding -inf, which turns NaN/+inf into NaN instead of -inf: they must notice and redo
    # the step with exact masking. PAD (0) and BOS (1) are always banned.
    cfg = DecodeCfg(strategy=strategy, max_len=7, beam_size=3, min_len=2, num_samples=3, seed=2, prune_finished=False)
    for seed in range(3):
        _assert_same(lambda s=seed: HashedStepModel(2, 8, seed=s, eos_boost=1.0, poison=poison), cfg)


class _Bonus:
    """A dynamic, non-masking processor: rewards one token in rows whose last token is even (not a step_mask)."""

    def __call__(self, logprobs: np.ndarray, ctx: StepContext) -> np.ndarray:
        if ctx.tokens.shape[1]:
            logprobs[:, 3] += np.where(ctx.tokens[:, -1] % 2 == 0, np.float32(0.25), np.float32(0.0))
        return logprobs


@pytest.mark.parametrize("strategy", ["beam", "greedy", "sample"])
def test_matches_with_explicit_processors(strategy: str) -> None:
    cfg = DecodeCfg(strategy=strategy, max_len=6, beam_size=3, min_len=2, num_samples=3, seed=4, no_repeat_ngram=2)
    make = lambda: HashedStepModel(3, 9, seed=8, eos_boost=1.0)  # noqa: E731
    built = build_processors(cfg)
    for processors in ([], built, [_Bonus(), *built], [*built, _Bonus()]):
        _assert_same(make, cfg, processors)


def test_identity_reorder_skips_select() -> None:
    # One image, one beam: every step's reorder is the identity, so the state is never gathered.
    model = HashedStepModel(1, 8, seed=1)
    beam_search(model, model.inputs(), DecodeCfg(beam_size=1, max_len=6))
    assert model.selects == 0
    model = HashedStepModel(2, 8, seed=1)
    beam_search(model, model.inputs(), DecodeCfg(beam_size=3, max_len=6, prune_finished=False))
    assert model.selects >= 1  # step 0 expands 2 rows to 6


@pytest.mark.parametrize("seed", range(5))
def test_plan_equals_running_the_processors(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    spec = RadixSpec(4, 2, 13)
    cfg = DecodeCfg(max_len=7, min_len=3, no_repeat_ngram=2, pad_id=0, bos_id=5, eos_id=6, radix=spec)
    processors = build_processors(cfg)
    plan = ProcessorPlan(processors, cfg.max_len, 7)
    assert plan.needs_history
    history = torch.randint(0, 7, (5, cfg.max_len), generator=g)
    for t in range(cfg.max_len):
        lp = torch.log_softmax(torch.randn(5, 7, generator=g), dim=1)
        lp[0, 0], lp[1, 5] = math.nan, math.inf
        tokens = history[:, :t]
        expected = apply_processors(ref.build_processors(cfg), lp.clone(), StepContext(t, cfg.max_len, tokens)).numpy()
        given = lp.numpy().copy()
        got = plan(given, t, tokens.numpy())
        assert not np.shares_memory(got, given) and np.array_equal(given, lp.numpy(), equal_nan=True)  # never written
        assert np.array_equal(got, expected, equal_nan=True)


@pytest.mark.parametrize(("base", "digits", "words"), [(3, 2, 7), (4, 3, 21), (5, 1, 5), (2, 3, 8), (4, 2, 1)])
@pytest.mark.parametrize("allow_unk", [True, False])
def test_radix_masks_match_the_previous_constraint(base: int, digits: int, words: int, allow_unk: bool) -> None:
    spec = RadixSpec(base, digits, words, allow_unk=allow_unk)
    new, old = RadixConstraint(spec), ref.RadixConstraint(spec)
    vocab = base + 3
    g = torch.Generator().manual_seed(base * 100 + digits)
    for max_len in (digits, 2 * digits + 1, 4 * digits):
        history = torch.randint(0, vocab, (40, max_len), generator=g)  # any tokens, PAD/BOS/EOS included
        for t in range(max_len):
            ctx = StepContext(t, max_len, history[:, :t])
            ctx_np = StepContext(t, max_len, history[:, :t].numpy())
            expected = old.allowed(ctx, 40, vocab, torch.device("cpu")).numpy()
            assert np.array_equal(new.allowed(ctx_np, 40, vocab), expected), (t, max_len)
            lp = torch.randn(40, vocab)
            assert np.array_equal(new(lp.numpy().copy(), ctx_np), old(lp.clone(), ctx).numpy())
