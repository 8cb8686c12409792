"""``Captioner.caption``: the one call every front end decodes through. Its replies carry the search's own tokens and
score, a per-call (or per-image) beam and length level override the captioner's defaults without changing them, bad
options fail with the public message before any work, and ``__call__``/``batch``/``caption_inputs`` are its text."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from edgecap.runtime.captioner import NO_BEAM_SEARCH, Caption, Captioner, CaptionerError, SkippedImageWarning
from edgecap.runtime.captioning import decode_cfg_for
from edgecap.runtime.decoding import decode
from edgecap.runtime.decoding.config import MAX_BEAM
from edgecap.runtime.length import NO_LENGTH_CONTROL, LengthLevelError
from edgecap.runtime.vocab import build_vocab
from edgecap.workshop.models import create_model
from edgecap.workshop.torch_runtime.refine import TorchRefineModel
from edgecap.workshop.torch_runtime.runtime import TorchStepModel
from tests.runtime.bundle.helpers import pixel_bundle

WORDS = ["a", "dog", "cat", "on", "the", "red", "blue", "sofa", "grass", "runs"]


class CountingStep:
    """A step model that counts its encodes: an option refused "before any work" leaves it at 0."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.encodes = inner, 0

    def encode(self, inputs: Any) -> Any:
        self.encodes += 1
        return self.inner.encode(inputs)

    def step(self, tokens: Any, state: Any) -> Any:
        return self.inner.step(tokens, state)

    def select(self, state: Any, index: Any) -> Any:
        return self.inner.select(state, index)


@pytest.fixture(scope="module")
def toy() -> tuple[Captioner, dict[str, torch.Tensor]]:
    """A random ort-test model at beam 3, on six images' worth of region features."""
    vocab = build_vocab([WORDS] * 5, kind="word", min_count=1)
    torch.manual_seed(0)
    model = create_model("ort-test", vocab_size=vocab.size, feature_dim=8).eval()
    cap = Captioner(None, CountingStep(TorchStepModel(model)), vocab, decode_cfg_for(vocab, beam_size=3, max_words=6))
    generator = torch.Generator().manual_seed(1)
    inputs = {"features": torch.randn(6, 3, 8, generator=generator), "boxes": torch.rand(6, 3, 4, generator=generator)}
    return cap, inputs


def at_beam(cap: Captioner, beam: int) -> Captioner:
    """The same model and vocab with ``beam`` as its default."""
    return Captioner(None, cap.step_model, cap.vocab, decode_cfg_for(cap.vocab, beam_size=beam, max_words=6))


def row(inputs: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    return {k: v[i : i + 1] for k, v in inputs.items()}


def test_replies_carry_the_searchs_tokens_and_score(toy: tuple[Captioner, dict[str, torch.Tensor]]) -> None:
    cap, inputs = toy
    replies = cap.caption(inputs)
    hypotheses = decode(cap.step_model, inputs, cap.decode_cfg)
    assert len(replies) == 6 and all(isinstance(r, Caption) for r in replies)
    for reply, hyps in zip(replies, hypotheses, strict=True):
        best = hyps[0]
        assert reply.tokens == tuple(best.tokens) and all(type(t) is int for t in reply.tokens)
        assert reply.score == pytest.approx(best.score) and type(reply.score) is float
        assert reply.finished == best.finished
        assert reply.text == " ".join(cap.vocab.decode(list(reply.tokens)))
    assert cap.caption_inputs(inputs) == [r.text for r in replies]


def test_a_per_call_beam_overrides_the_default_and_leaves_it(toy: tuple[Captioner, dict[str, torch.Tensor]]) -> None:
    cap, inputs = toy
    for beam in (1, 2, 5):
        assert same(cap.caption(inputs, beam=beam), at_beam(cap, beam).caption(inputs))
    assert cap.decode_cfg.beam_size == 3 and same(cap.caption(inputs), at_beam(cap, 3).caption(inputs))
    greedy = decode(cap.step_model, inputs, decode_cfg_for(cap.vocab, beam_size=1, max_words=6))
    assert [r.score for r in cap.caption(inputs, beam=1)] == pytest.approx([h[0].score for h in greedy])


def test_per_image_beams_decode_as_each_image_alone(toy: tuple[Captioner, dict[str, torch.Tensor]]) -> None:
    """Rows of one beam are not consecutive (an index, not a slice) and share calls with other images; batch sizes
    of 1 and 2 cut the groups: every caption is still the one its image gets alone at its beam."""
    cap, inputs = toy
    beams = [1, 3, None, 1, 2, 3]
    alone = [cap.caption(row(inputs, i), beam=b)[0] for i, b in enumerate(beams)]
    for batch_size in (None, 1, 2):
        assert same(cap.caption(inputs, beam=beams, batch_size=batch_size), alone)
    assert same(cap.caption(inputs, beam=np.array([1, 3, 3, 1, 2, 3])), alone)  # None (the default) is beam 3


def same(replies: list[Caption], expected: list[Caption]) -> bool:
    """The same captions; scores equal to float32 rounding (torch's CPU kernels sum in a batch-dependent order; the
    exported graphs' batch invariance is tests/test_captioner_batch_invariance.py's)."""
    return [(r.text, r.tokens, r.finished) for r in replies] == [(e.text, e.tokens, e.finished) for e in expected] and [
        r.score for r in replies
    ] == pytest.approx([e.score for e in expected], rel=1e-5)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"beam": 0}, CaptionerError, f"beam must be an integer in 1..{MAX_BEAM} (MAX_BEAM), got 0"),
        ({"beam": MAX_BEAM + 1}, CaptionerError, f"got {MAX_BEAM + 1}"),
        ({"beam": True}, CaptionerError, "beam must be an integer"),
        ({"beam": "3"}, CaptionerError, "beam must be an integer"),
        ({"beam": [1, 2, 3, 1, 0, 3]}, CaptionerError, "got 0"),  # one bad image's beam refuses the call
        ({"beam": [1, 2]}, CaptionerError, "beam: 2 value(s) for 6 image(s)"),
        ({"length_level": 2}, LengthLevelError, NO_LENGTH_CONTROL),
        ({"length_level": [None] * 5 + [1]}, LengthLevelError, NO_LENGTH_CONTROL),
        ({"batch_size": 0}, CaptionerError, "batch_size must be an integer >= 1"),
        ({"errors": "ignore"}, CaptionerError, "errors must be 'raise' or 'skip'"),
    ],
)
def test_bad_options_raise_the_public_message_before_any_work(
    toy: tuple[Captioner, dict[str, torch.Tensor]], options: dict[str, Any], error: type, message: str
) -> None:
    cap, inputs = toy
    step = cap.step_model
    before = step.encodes
    with pytest.raises(error) as raised:
        cap.caption(inputs, **options)
    assert str(raised.value) == message or message in str(raised.value)
    assert isinstance(raised.value, ValueError) and step.encodes == before
    scalar = {k: v for k, v in options.items() if k in ("beam", "length_level") and not isinstance(v, list)}
    if scalar:  # the check front ends run on a request alone says the same
        with pytest.raises(error, match=re.escape(message)):
            cap.check_options(**scalar)


def test_a_beam_is_refused_on_mask_predict_and_levels_apply() -> None:
    vocab = build_vocab([WORDS] * 5, kind="word", min_count=1)
    torch.manual_seed(0)
    model = create_model("labert-test", vocab_size=vocab.size, feature_dim=8).eval()
    cap = Captioner(
        None, TorchRefineModel(model), vocab, decode_cfg_for(vocab, strategy="mask_predict", length_level=2)
    )
    inputs = {"features": torch.randn(3, 3, 8), "boxes": torch.rand(3, 3, 4)}
    with pytest.raises(CaptionerError, match="mask-predict") as raised:
        cap.caption(inputs, beam=3)
    assert NO_BEAM_SEARCH in str(raised.value)
    assert cap.caption(inputs, beam=1) == cap.caption(inputs)
    levels = [1, 4, 1]
    alone = [cap.caption(row(inputs, i), length_level=lv)[0] for i, lv in enumerate(levels)]
    assert same(cap.caption(inputs, length_level=levels), alone)
    assert all(len(c.text.split()) <= model.levels[lv - 1][1] for c, lv in zip(alone, levels, strict=True))
    with pytest.raises(LengthLevelError, match="1..4"):
        cap.check_options(length_level=7)


# -- images, on a bundle -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bundled(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    bundle, _ = pixel_bundle(tiny_data, tmp_path_factory)
    with Captioner.load(bundle, runtime="onnxruntime", threads=1) as cap:
        yield cap


def pictures(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, (36 + 4 * i, 44, 3), dtype=np.uint8) for i in range(count)]


def test_images_caption_as_call_batch_and_prepared_inputs(bundled: Captioner) -> None:
    arrays = pictures(4)
    replies = bundled.caption(arrays)
    texts = [r.text for r in replies]
    assert texts == bundled.batch(arrays) == [bundled(a) for a in arrays]
    assert bundled.caption(bundled.prepare(arrays)) == replies
    assert bundled.caption(np.stack([arrays[0], arrays[0]])) == [replies[0], replies[0]]  # N×H×W×3: N images
    beams = [1, 3, 2, 1]
    alone = [bundled.caption(a, beam=b)[0] for a, b in zip(arrays, beams, strict=True)]
    assert bundled.caption(arrays, beam=beams, batch_size=3) == alone


def test_skipped_images_leave_none_and_warn_at_the_callers_line(bundled: Captioner) -> None:
    arrays = pictures(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SkippedImageWarning)
        replies = bundled.caption([arrays[0], b"not an image", arrays[1], arrays[2]], errors="skip")
        texts = bundled.batch([b"", arrays[0]], errors="skip")
    assert replies[1] is None and [r.text for r in (replies[0], replies[2], replies[3]) if r] == bundled.batch(arrays)
    assert texts == [None, bundled(arrays[0])]
    skipped = [w for w in caught if isinstance(w.message, SkippedImageWarning)]
    assert [w.message.index for w in skipped] == [1, 0] and {w.filename for w in skipped} == {__file__}
    with pytest.raises(CaptionerError, match="beam must be"):
        bundled.caption([b"not an image"], beam=0, errors="skip")  # the option first: no image is read
