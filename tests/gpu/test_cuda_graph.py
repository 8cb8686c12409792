"""The torch step on a GPU by step mode: the CUDA-graph (and compiled) static step decodes what the eager step
decodes at FP32, captures once per batch shape, and runs at FP16/BF16. Skipped, with the reason, without CUDA."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

from edgecap.runtime.decoding import DecodeCfg, decode  # noqa: E402
from edgecap.workshop.models import create_model  # noqa: E402
from edgecap.workshop.torch_runtime.runtime import TorchStepModel  # noqa: E402


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _setup(name: str = "acort-test", batch: int = 6) -> tuple[torch.nn.Module, dict, DecodeCfg]:
    torch.manual_seed(0)
    model = create_model(name, vocab_size=771, feature_dim=12).eval()
    g = torch.Generator().manual_seed(0)
    inputs = {
        "features": torch.randn(batch, 6, 12, generator=g),
        "boxes": torch.rand(batch, 6, 4, generator=g).sort(-1).values,
        "feature_mask": torch.ones(batch, 6, dtype=torch.bool),
    }
    cfg = DecodeCfg(pad_id=0, bos_id=769, eos_id=770, beam_size=3, max_len=16)
    if model.length_levels:
        cfg = DecodeCfg(pad_id=0, bos_id=769, eos_id=770, beam_size=3, max_len=16, length_level=3)
    return model, inputs, cfg


def _tokens(step_model: TorchStepModel, inputs: dict, cfg: DecodeCfg) -> list:
    return [[h.tokens for h in hs] for hs in decode(step_model, inputs, cfg)]


@pytest.mark.parametrize("name", ["acort-test", "acort-test-len"])
def test_cuda_graph_step_gives_the_eager_captions_at_fp32(name: str) -> None:
    model, inputs, cfg = _setup(name)
    eager = _tokens(TorchStepModel(model, "cuda"), inputs, cfg)
    graph = TorchStepModel(model, "cuda", step_mode="cuda-graph")
    assert _tokens(graph, inputs, cfg) == eager
    captures = graph._static.captures
    assert _tokens(graph, inputs, cfg) == eager  # replayed, not re-captured
    assert graph._static.captures == captures
    assert _tokens(TorchStepModel(model, "cpu"), inputs, cfg) == eager


def test_cuda_graph_step_runs_at_fp16_and_bf16() -> None:
    model, inputs, cfg = _setup()
    reference = _tokens(TorchStepModel(model, "cuda"), inputs, cfg)
    for kw in ({"dtype": torch.float16}, {"dtype": torch.bfloat16}, {"autocast": torch.float16}):
        model, _, _ = _setup()
        got = _tokens(TorchStepModel(model, "cuda", step_mode="cuda-graph", **kw), inputs, cfg)
        assert len(got) == len(reference) and all(len(hs) == len(r) for hs, r in zip(got, reference, strict=True))


def test_cuda_graph_step_returns_host_logprobs_of_live_rows_only() -> None:
    model, inputs, _ = _setup(batch=2)
    graph = TorchStepModel(model, "cuda", step_mode="cuda-graph")
    state = graph.encode(inputs)
    logprobs, state = graph.step(np.full(2, 769, dtype=np.int64), state)
    assert isinstance(logprobs, np.ndarray) and logprobs.shape == (2, 771) and logprobs.dtype == np.float32
    state = graph.select(state, np.array([1], dtype=np.int64))  # pruned to one row: same capacity, fewer live rows
    logprobs, state = graph.step(np.array([5], dtype=np.int64), state)
    assert logprobs.shape == (1, 771)
    np.testing.assert_allclose(np.exp(logprobs).sum(-1), 1.0, rtol=1e-4)


def test_compiled_step_gives_the_eager_captions_at_fp32() -> None:
    model, inputs, cfg = _setup(batch=2)
    eager = _tokens(TorchStepModel(model, "cuda"), inputs, cfg)
    assert _tokens(TorchStepModel(model, "cuda", step_mode="compile"), inputs, cfg) == eager


def test_onnxruntime_outputs_without_dlpack_stay_on_the_device() -> None:
    """The CUDA Array Interface fallback of ``_to_torch`` (onnxruntime builds whose OrtValue lacks DLPack): a device
    buffer is wrapped, not copied through the host."""
    from edgecap.workshop.torch_runtime.onnxruntime_binding import to_torch as _to_torch
    from tests.runtime.backends.test_onnxruntime_gpu import _FakeOrtValue

    source = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    out = _to_torch(_FakeOrtValue(source), source.device)
    assert out.device.type == "cuda" and out.data_ptr() == source.data_ptr()
    assert torch.equal(out, source)
    empty = _to_torch(_FakeOrtValue(torch.empty(0, 4, device="cuda")), source.device)
    assert empty.shape == (0, 4) and empty.device.type == "cuda"


def test_threads_capture_and_replay_their_own_graphs() -> None:
    import threading

    model, inputs, cfg = _setup(batch=4)
    graph = TorchStepModel(model, "cuda", step_mode="cuda-graph")
    expected = _tokens(TorchStepModel(model, "cuda"), inputs, cfg)
    results: list[object] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(3):
                results.append(_tokens(graph, inputs, cfg))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == [expected] * 9
