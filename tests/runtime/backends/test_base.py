"""The Runtime base class (activation, feed checks, latency), the registry, and RuntimeStepModel over numpy graphs."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pytest
import torch

from edgecap.runtime.backends import (
    Runtime,
    RuntimeInputError,
    RuntimeStateError,
    RuntimeStepModel,
    TensorMeta,
)
from edgecap.runtime.decoding import DecodeCfg, DecodeInputError, beam_search, greedy, sample


class FunctionRuntime(Runtime):
    """A graph that is a Python function over numpy arrays; records lifecycle calls."""

    def __init__(self, fn: Callable[..., dict], inputs: Mapping[str, TensorMeta], name: str = "fn") -> None:
        super().__init__(name)
        self.fn, self.inputs, self.events = fn, dict(inputs), []

    def _activate(self) -> None:
        self.events.append("activate")

    def _input_metadata(self) -> Mapping[str, TensorMeta]:
        return self.inputs

    def _infer(self, feed):  # type: ignore[no-untyped-def]
        return self.fn(**feed)

    def _close(self) -> None:
        self.events.append("close")


def adder() -> FunctionRuntime:
    inputs = {"x": TensorMeta.of("x", np.float32, ("batch", 3)), "n": TensorMeta.of("n", "int64", (None,))}
    return FunctionRuntime(lambda x, n: {"y": x + n[:, None]}, inputs, name="adder")


def test_context_manager_activates_and_closes() -> None:
    rt = adder()
    with pytest.raises(RuntimeStateError, match="active"):
        rt.infer({"x": np.zeros((1, 3), np.float32), "n": np.zeros(1, np.int64)})
    with pytest.raises(RuntimeStateError):
        rt.input_metadata()
    with rt as active:
        assert active is rt and rt.is_active
        out = rt.infer({"x": np.ones((2, 3), np.float32), "n": np.array([1, 2])})
        assert out["y"].tolist() == [[2, 2, 2], [3, 3, 3]]
        assert rt.last_latency_s is not None and rt.last_latency_s >= 0
        assert list(rt.input_metadata()) == ["x", "n"]
        rt.activate()  # idempotent
    assert not rt.is_active
    rt.close()  # idempotent
    assert rt.events == ["activate", "close"]
    assert rt.inference_count == 1


@pytest.mark.parametrize(
    ("feed", "message"),
    [
        ({"x": np.zeros((1, 3), np.float32)}, r"missing \['n'\]"),
        ({"x": np.zeros((1, 3), np.float32), "n": np.zeros(1, np.int64), "z": np.zeros(1)}, r"unexpected \['z'\]"),
        ({"x": np.zeros((1, 3), np.float64), "n": np.zeros(1, np.int64)}, "'x' has dtype float64, expected float32"),
        ({"x": np.zeros((1, 3, 1), np.float32), "n": np.zeros(1, np.int64)}, "'x' has rank 3"),
        ({"x": np.zeros((1, 4), np.float32), "n": np.zeros(1, np.int64)}, "'x' has size 4 on axis 1, expected 3"),
        ({"x": [[0.0, 0.0, 0.0]], "n": np.zeros(1, np.int64)}, "'x' must be an array"),
    ],
)
def test_bad_feeds_are_named(feed: dict, message: str) -> None:
    with adder() as rt, pytest.raises(RuntimeInputError, match=message):
        rt.infer(feed)


def test_torch_and_numpy_dtypes_share_names() -> None:
    meta = TensorMeta.of("x", torch.float16, (None,))
    assert meta.dtype == "float16"
    meta.check(np.zeros(2, np.float16), "rt")
    meta.check(torch.zeros(2, dtype=torch.float16), "rt")


# -- RuntimeStepModel over numpy graphs --------------------------------------------------------------------------------

VOCAB, HIDDEN, FEAT = 9, 5, 4
RNG = np.random.default_rng(0)
W_IN = RNG.normal(size=(FEAT, HIDDEN)).astype(np.float32)
EMB = RNG.normal(size=(VOCAB, HIDDEN)).astype(np.float32)
W_OUT = (RNG.normal(size=(HIDDEN, VOCAB)) * 2).astype(np.float32)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def np_encode(features: np.ndarray) -> dict:
    h = np.tanh(features.mean(axis=1) @ W_IN)
    return {"h": h.astype(np.float32), "trace": np.zeros((features.shape[0], 0), np.int64)}


def np_step(tokens: np.ndarray, h: np.ndarray, trace: np.ndarray) -> dict:
    h = np.tanh(h + EMB[tokens]).astype(np.float32)
    return {"logprobs": _log_softmax(h @ W_OUT), "h_out": h, "trace_out": np.concatenate([trace, tokens[:, None]], 1)}


class TorchReference:
    """The same model written directly as a torch StepModel: torch state and log-probs, the search's numpy tokens
    and row indices converted at its boundary."""

    def encode(self, inputs):  # type: ignore[no-untyped-def]
        state = np_encode(inputs["features"].numpy())
        return {k: torch.from_numpy(v) for k, v in state.items()}

    def step(self, tokens, state):  # type: ignore[no-untyped-def]
        assert isinstance(tokens, np.ndarray) and tokens.dtype == np.int64
        out = np_step(tokens, state["h"].numpy(), state["trace"].numpy())
        return torch.from_numpy(out["logprobs"]), {
            "h": torch.from_numpy(out["h_out"]),
            "trace": torch.from_numpy(out["trace_out"]),
        }

    def select(self, state, index):  # type: ignore[no-untyped-def]
        assert isinstance(index, np.ndarray) and index.dtype == np.int64
        return {k: v.index_select(0, torch.from_numpy(index)) for k, v in state.items()}


def numpy_step_model(token_dtype: str = "int64") -> RuntimeStepModel:
    encoder = FunctionRuntime(np_encode, {"features": TensorMeta.of("features", "float32", (None, None, FEAT))}, "enc")
    step_inputs = {
        "tokens": TensorMeta.of("tokens", token_dtype, (None,)),
        "h": TensorMeta.of("h", "float32", (None, HIDDEN)),
        "trace": TensorMeta.of("trace", "int64", (None, None)),
    }
    step = FunctionRuntime(lambda tokens, h, trace: np_step(tokens.astype(np.int64), h, trace), step_inputs, "step")
    return RuntimeStepModel(encoder, step, ["h", "trace"])


def inputs() -> dict[str, torch.Tensor]:
    return {"features": torch.from_numpy(np.random.default_rng(1).normal(size=(3, 6, FEAT)).astype(np.float32))}


@pytest.mark.parametrize("token_dtype", ["int64", "int32"])
def test_runtime_step_model_matches_direct_torch(token_dtype: str) -> None:
    cfg = DecodeCfg(beam_size=3, n_best=3, max_len=6)
    with numpy_step_model(token_dtype) as model:
        via_runtime = beam_search(model, inputs(), cfg)
        greedy_runtime = greedy(model, inputs(), cfg)
        samples_runtime = sample(model, inputs(), cfg.replace(num_samples=4, seed=3))
    direct = TorchReference()
    assert via_runtime == beam_search(direct, inputs(), cfg)
    assert greedy_runtime == greedy(direct, inputs(), cfg)
    assert samples_runtime == sample(direct, inputs(), cfg.replace(num_samples=4, seed=3))
    assert not model.encoder.is_active and not model.step_runtime.is_active


def test_runtime_step_model_select_gathers_rows() -> None:
    with numpy_step_model() as model:
        state = model.encode(inputs())
        assert isinstance(state["h"], np.ndarray)
        picked = model.select(state, torch.tensor([2, 0, 2]))
        np.testing.assert_array_equal(picked["h"], state["h"][[2, 0, 2]])


def test_runtime_step_model_reports_missing_inputs_and_outputs() -> None:
    with numpy_step_model() as model:
        with pytest.raises(RuntimeInputError, match="lack \\['features'\\]"):
            model.encode({"pixels": torch.zeros(1, 3)})
        with pytest.raises(RuntimeInputError, match="no input"):
            model.encode({**inputs(), "boxes": torch.zeros(3, 6, 4)})
    broken = RuntimeStepModel(model.encoder, model.step_runtime, ["h", "trace"], state_output_names=["h_new", "t_new"])
    with broken, pytest.raises(ValueError, match="h_new"):
        broken.step(torch.zeros(3, dtype=torch.long), broken.encode(inputs()))


def test_runtime_step_model_carries_states_the_step_does_not_output() -> None:
    """A step graph that outputs only the states it changes: the others ride along unchanged, and decoding is the
    same as with a graph that copies them out every step."""
    bias = {"h0": np.linspace(-1, 1, HIDDEN, dtype=np.float32)}

    def encode(features: np.ndarray) -> dict:
        return {**np_encode(features), "h0": np.repeat(bias["h0"][None], features.shape[0], 0)}

    def step_fn(tokens: np.ndarray, h: np.ndarray, trace: np.ndarray, h0: np.ndarray) -> dict:
        out = np_step(tokens.astype(np.int64), h + h0, trace)
        return {"logprobs": out["logprobs"], "h_out": out["h_out"], "trace_out": out["trace_out"]}

    def step_all(tokens: np.ndarray, h: np.ndarray, trace: np.ndarray, h0: np.ndarray) -> dict:
        return {**step_fn(tokens, h, trace, h0), "h0_out": h0.copy()}

    enc_meta = {"features": TensorMeta.of("features", "float32", (None, None, FEAT))}
    step_meta = {
        "tokens": TensorMeta.of("tokens", "int64", (None,)),
        "h": TensorMeta.of("h", "float32", (None, HIDDEN)),
        "trace": TensorMeta.of("trace", "int64", (None, None)),
        "h0": TensorMeta.of("h0", "float32", (None, HIDDEN)),
    }
    names = ["h", "trace", "h0"]
    carried = RuntimeStepModel(
        FunctionRuntime(encode, enc_meta, "enc"),
        FunctionRuntime(step_fn, step_meta, "step"),
        names,
        updated_state_names=["trace", "h"],  # any order: kept in state order
    )
    copied = RuntimeStepModel(
        FunctionRuntime(encode, enc_meta, "enc"), FunctionRuntime(step_all, step_meta, "s"), names
    )
    assert carried.updated_state_names == ("h", "trace") and carried.state_output_names == ("h_out", "trace_out")
    cfg = DecodeCfg(beam_size=3, n_best=2, max_len=6)
    with carried, copied:
        state = carried.encode(inputs())
        _, after = carried.step(torch.zeros(3, dtype=torch.long), state)
        assert after["h0"] is state["h0"] and after["trace"].shape == (3, 1)
        assert beam_search(carried, inputs(), cfg) == beam_search(copied, inputs(), cfg)
    with pytest.raises(ValueError, match="not state names"):
        RuntimeStepModel(carried.encoder, carried.step_runtime, names, updated_state_names=["h", "cache"])


def carried_step_model(ops: str = "numpy") -> RuntimeStepModel:
    """h is updated by the step graph; h0 (like cross-attention keys) is carried unchanged."""

    def encode(features: np.ndarray) -> dict:
        h = np_encode(features)["h"]
        return {"h": h, "h0": (h * 2 + np.arange(h.shape[0], dtype=np.float32)[:, None]).astype(np.float32)}

    def step_fn(tokens: np.ndarray, h: np.ndarray, h0: np.ndarray) -> dict:
        out = np_step(tokens.astype(np.int64), h + h0, np.zeros((h.shape[0], 0), np.int64))
        return {"logprobs": out["logprobs"], "h_out": out["h_out"]}

    enc_meta = {"features": TensorMeta.of("features", "float32", (None, None, FEAT))}
    step_meta = {
        "tokens": TensorMeta.of("tokens", "int64", (None,)),
        "h": TensorMeta.of("h", "float32", (None, HIDDEN)),
        "h0": TensorMeta.of("h0", "float32", (None, HIDDEN)),
    }
    if ops == "torch":  # the same graphs with torch tensors in and out (TorchOps: index_select gathers)

        def as_torch(fn: Callable[..., dict]) -> Callable[..., dict]:
            def run(**feed: torch.Tensor) -> dict:
                out = fn(**{k: np.asarray(v) for k, v in feed.items()})
                return {k: torch.from_numpy(v) for k, v in out.items()}

            return run

        encode, step_fn = as_torch(encode), as_torch(step_fn)
    encoder, step = FunctionRuntime(encode, enc_meta, "enc"), FunctionRuntime(step_fn, step_meta, "step")
    encoder.array_type = step.array_type = ops  # type: ignore[misc]
    return RuntimeStepModel(encoder, step, ["h", "h0"], updated_state_names=["h"])


def test_select_skips_a_carried_gather_only_when_it_changes_nothing() -> None:
    """After the B -> B·K expansion a carried state's rows within an image are identical copies: reordering beams
    within images returns the same array, while a gather across images (or of an array select() did not make) still
    copies rows. Every result equals the plain gather."""
    with carried_step_model() as model:
        state = model.encode(inputs())  # 3 images
        expanded = model.select(state, torch.tensor([0, 0, 1, 1, 2, 2]))  # expansion: always gathered
        assert expanded["h0"] is not state["h0"]
        np.testing.assert_array_equal(expanded["h0"], state["h0"][[0, 0, 1, 1, 2, 2]])
        reordered = model.select(expanded, torch.tensor([1, 0, 2, 2, 5, 4]))  # within each image
        assert reordered["h0"] is expanded["h0"]  # nothing would change: no copy
        assert reordered["h"] is not expanded["h"]  # the updated state is always gathered
        np.testing.assert_array_equal(reordered["h"], expanded["h"][[1, 0, 2, 2, 5, 4]])
        across = model.select(reordered, torch.tensor([0, 2, 2, 3, 4, 5]))  # row 1 now copies image 1
        assert across["h0"] is not reordered["h0"]
        np.testing.assert_array_equal(across["h0"], expanded["h0"][[0, 2, 2, 3, 4, 5]])
        again = model.select(across, torch.tensor([1, 2, 0, 3, 4, 5]))  # rows 1 and 2 are both image 1
        np.testing.assert_array_equal(again["h0"], across["h0"][[1, 2, 0, 3, 4, 5]])
        assert again["h0"] is not across["h0"]  # row 0 gets image 1's row: changed
        same = model.select(again, torch.tensor([0, 0, 2, 3, 4, 5]))  # rows 0 and 1 hold the same image-1 row
        assert same["h0"] is again["h0"]
        foreign = {"h": expanded["h"], "h0": expanded["h0"].copy()}  # not an array select() returned
        assert model.select(foreign, torch.tensor([1, 0, 2, 3, 4, 5]))["h0"] is not foreign["h0"]
        with pytest.raises(IndexError):
            model.select(reordered, torch.tensor([0, 9, 2, 3, 4, 5]))
        pruned = model.select(reordered, torch.tensor([2, 3]))  # pruning: a different batch size
        np.testing.assert_array_equal(pruned["h0"], expanded["h0"][[2, 3]])


def random_select_index(rng: np.random.Generator, rows: int) -> np.ndarray:
    """A random ``select`` index over ``rows`` rows: mostly a reorder within pairs of rows (the beams of an "image"),
    sometimes another count of rows (a prune, or rows repeated)."""
    size = rows if rng.random() < 0.8 else int(rng.integers(1, rows + 3))
    base = rng.integers(0, rows, size=size)
    return np.where(rng.random(size) < 0.7, base - base % 2, base)


@pytest.mark.parametrize("ops", ["numpy", "torch"])
def test_select_with_skipping_matches_plain_gathers(ops: str) -> None:
    """Random beam reorders and prunes: every selected state equals the plain gather of the original rows, and
    beam search gives the same hypotheses with the skipping select and with take_all."""
    rng = np.random.default_rng(5)
    with carried_step_model(ops) as model:
        state = model.encode(inputs())
        truth = {k: np.asarray(v) for k, v in state.items()}
        for _ in range(40):
            index = random_select_index(rng, int(np.asarray(state["h"]).shape[0]))
            state = model.select(state, torch.from_numpy(index))
            truth = {k: v[index] for k, v in truth.items()}
            for name, value in state.items():
                np.testing.assert_array_equal(np.asarray(value), truth[name])
        cfg = DecodeCfg(beam_size=3, n_best=3, max_len=6)
        got = beam_search(model, inputs(), cfg)
        model.select = lambda state, index: model._loop_ops.take_all(state, index)  # type: ignore[method-assign]
        assert got == beam_search(model, inputs(), cfg)


def image_step_model(images_dim: bool = True, ops: str = "numpy") -> RuntimeStepModel:
    """``carried_step_model`` whose step graph takes h0 once per image (leading dimension ``images``, each image's
    hypotheses consecutive), as an exported ORT/ACORT step takes its cross-attention keys; ``images_dim=False``
    declares h0 per hypothesis instead (a bundle exported before image states)."""
    model = carried_step_model(ops)

    def step_fn(tokens: np.ndarray, h: np.ndarray, h0: np.ndarray) -> dict:
        h, h0 = np.asarray(h), np.asarray(h0)
        assert h.shape[0] % h0.shape[0] == 0, (h.shape, h0.shape)
        per_row = np.repeat(h0, h.shape[0] // h0.shape[0], axis=0)
        out = np_step(np.asarray(tokens).astype(np.int64), h + per_row, np.zeros((h.shape[0], 0), np.int64))
        result = {"logprobs": out["logprobs"], "h_out": out["h_out"]}
        return {k: torch.from_numpy(v) for k, v in result.items()} if ops == "torch" else result

    meta = dict(model.step_runtime.inputs)
    meta["h0"] = TensorMeta.of("h0", "float32", ("images" if images_dim else "batch", HIDDEN))
    step = FunctionRuntime(step_fn, meta, "step")
    step.array_type = ops  # type: ignore[misc]
    return RuntimeStepModel(model.encoder, step, ["h", "h0"], updated_state_names=["h"])


def test_image_states_stay_once_per_image_while_beams_stay_together() -> None:
    with image_step_model() as model:
        state = model.encode(inputs())  # 3 images
        assert model.image_states == ("h0",)
        images = state["h0"]
        expanded = model.select(state, np.array([0, 0, 1, 1, 2, 2]))  # B -> B·K: no gather, k = 2
        assert expanded["h0"] is images and expanded["h"].shape[0] == 6
        reordered = model.select(expanded, np.array([1, 0, 2, 2, 5, 4]))  # beams reordered within images
        assert reordered["h0"] is images
        pruned = model.select(reordered, np.array([0, 1, 4, 5]))  # image 1 done: its rows leave
        np.testing.assert_array_equal(pruned["h0"], images[[0, 2]])
        mixed = model.select(pruned, np.array([0, 2, 2, 3]))  # not k consecutive rows per image: per hypothesis
        np.testing.assert_array_equal(mixed["h0"], images[[0, 2, 2, 2]])
        back = model.select(mixed, np.array([1, 1, 2, 2]))  # groups again: one row per group of 2
        np.testing.assert_array_equal(back["h0"], images[[2, 2]])
        logprobs, _ = model.step(np.zeros(4, dtype=np.int64), back)
        assert logprobs.shape[0] == 4
        with pytest.raises(DecodeInputError, match="cannot share the image states"):
            model.select({"h": np.zeros((5, HIDDEN), np.float32), "h0": images[:2]}, np.arange(5))
    with image_step_model(images_dim=False) as per_row:
        per_row.encode(inputs())
        assert per_row.image_states == ()


@pytest.mark.parametrize("ops", ["numpy", "torch"])
def test_image_states_decode_like_per_hypothesis_states(ops: str) -> None:
    """Random reorders and prunes keep the image states equal to the per-hypothesis gather once expanded; beam
    search, greedy decoding and sampling give the same hypotheses as a graph fed per hypothesis."""
    rng = np.random.default_rng(7)
    with image_step_model(ops=ops) as model:
        state = model.encode(inputs())
        truth = {k: np.asarray(v) for k, v in state.items()}
        for _ in range(40):
            index = random_select_index(rng, int(np.asarray(state["h"]).shape[0]))
            size = index.shape[0]
            state = model.select(state, index)
            truth = {k: v[index] for k, v in truth.items()}
            h0 = np.asarray(state["h0"])
            np.testing.assert_array_equal(np.repeat(h0, size // h0.shape[0], axis=0), truth["h0"])
            np.testing.assert_array_equal(np.asarray(state["h"]), truth["h"])
    cfg = DecodeCfg(beam_size=3, n_best=3, max_len=6, prune_finished=True)
    with image_step_model(ops=ops) as grouped, image_step_model(images_dim=False, ops=ops) as per_row:
        assert beam_search(grouped, inputs(), cfg) == beam_search(per_row, inputs(), cfg)
        assert greedy(grouped, inputs(), cfg) == greedy(per_row, inputs(), cfg)
        sampling = cfg.replace(num_samples=4, seed=3)
        assert sample(grouped, inputs(), sampling) == sample(per_row, inputs(), sampling)


def test_numpy_ops_feed_is_a_view_when_it_can_be() -> None:
    from edgecap.runtime.backends.bridge import NumpyOps

    ops = NumpyOps()
    tokens = np.array([3, 1, 2], dtype=np.int64)
    assert ops.feed(tokens, "int64") is tokens  # the decode loop's case: the search's own array, no copy
    cast = ops.feed(tokens, "int32")
    assert cast.dtype == np.int32 and cast.tolist() == [3, 1, 2]
    strided = ops.feed(np.arange(6)[::2], "int64")
    assert strided.flags.c_contiguous and strided.tolist() == [0, 2, 4]
    from_torch = torch.tensor([3, 1, 2])
    same = ops.feed(from_torch, "int64")  # decode inputs may still be torch tensors (training/eval code)
    assert same.dtype == np.int64 and np.shares_memory(same, from_torch.numpy())
    grad = ops.feed(torch.ones(2, requires_grad=True), "float32")
    assert grad.dtype == np.float32 and grad.tolist() == [1.0, 1.0]
    assert ops.feed(torch.tensor([True, False]), "bool").tolist() == [True, False]
    half = ops.feed(torch.ones(2), "float16")
    assert half.dtype == np.float16
    logprobs = ops.logprobs(np.zeros((2, 3), dtype=np.float16))
    assert logprobs.dtype == np.float32
