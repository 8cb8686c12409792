"""ServedCaptioner: one reply or one error per request, captions equal to Captioner's, whatever the batch-mates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgecap.runtime.captioner import Captioner
from edgecap.runtime.serving.batch import ServedCaptioner, ServedRequest
from edgecap.runtime.serving.protocol import CaptionReply, RequestError
from tests.runtime.bundle.helpers import labert_bundle
from tests.runtime.serving.conftest import images, png


@pytest.fixture(scope="module")
def captioner(served_bundle: Path) -> Captioner:
    return Captioner.load(served_bundle, runtime="onnxruntime")


def test_encoded_and_pixel_requests_caption_like_captioner(captioner: Captioner) -> None:
    arrays = images(6)
    expected = captioner.batch(arrays)
    requests = [ServedRequest([png(a)] if i % 2 else [a]) for i, a in enumerate(arrays)]
    answers = ServedCaptioner(captioner).answer(requests)
    assert [a[0].caption for a in answers if isinstance(a, list)] == expected


def test_bad_requests_get_their_own_errors_and_the_rest_their_captions(captioner: Captioner) -> None:
    arrays = images(4, seed=1)
    expected = captioner.batch(arrays)
    bad = [
        ServedRequest([b"not an image"]),
        ServedRequest([b""]),
        ServedRequest([np.zeros((8, 8, 4), np.uint8)]),  # 4 channels
        ServedRequest([np.zeros((8, 8, 3), np.float32)]),  # not uint8
        ServedRequest([arrays[0]], length_levels=[3]),  # no length control on this model
        ServedRequest([arrays[0]], beams=[0]),
    ]
    mixed = [bad[0], ServedRequest([arrays[0]]), bad[1], bad[2], ServedRequest([png(arrays[1])]), bad[3]]
    mixed += [ServedRequest([arrays[2], arrays[3]]), bad[4], bad[5]]
    answers = ServedCaptioner(captioner).answer(mixed)
    errors = [a for a in answers if isinstance(a, RequestError)]
    assert len(errors) == 6 and all(str(e) for e in errors)
    assert "not a recognised image" in str(answers[0]) and "H×W×3 uint8" in str(answers[3])
    good = [a for a in answers if isinstance(a, list)]
    assert [r.caption for a in good for r in a] == expected


def test_a_caption_does_not_depend_on_its_batch_mates(captioner: Captioner) -> None:
    arrays = images(7, seed=2)
    served = ServedCaptioner(captioner)
    alone = [served.answer([ServedRequest([a])])[0] for a in arrays]
    together = served.answer([ServedRequest([a]) for a in arrays])
    assert together == alone


def test_beams_are_grouped_and_each_matches_a_captioner_at_that_beam(captioner: Captioner, served_bundle: Path) -> None:
    arrays = images(4, seed=3)
    beams = [1, 3, 1, 2]
    answers = ServedCaptioner(captioner).answer(
        [ServedRequest([a], beams=[b]) for a, b in zip(arrays, beams, strict=True)]
    )
    for array, beam, answer in zip(arrays, beams, answers, strict=True):
        with Captioner.load(served_bundle, runtime="onnxruntime", beam=beam) as direct:
            assert isinstance(answer, list) and answer[0].caption == direct(array)


def test_tokens_and_score_describe_the_caption(captioner: Captioner) -> None:
    (answer,) = ServedCaptioner(captioner).answer([ServedRequest(images(1))])
    assert isinstance(answer, list)
    reply = answer[0]
    assert isinstance(reply, CaptionReply) and reply.tokens and reply.score is not None and reply.score < 0
    assert " ".join(captioner.vocab.decode(list(reply.tokens))) == reply.caption


def test_options_must_match_the_images() -> None:
    with pytest.raises(RequestError, match="2 image"):
        ServedRequest([b"a", b"b"], beams=[1])


def test_length_levels_group_and_a_beam_is_refused_on_mask_predict(
    tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    bundle, _ = labert_bundle(tiny_data, tmp_path_factory)
    arrays = images(3, seed=4)
    with Captioner.load(bundle, runtime="onnxruntime") as labert:
        levels = [1, 4, 1]
        requests = [ServedRequest([a], length_levels=[lv]) for a, lv in zip(arrays, levels, strict=True)]
        requests += [ServedRequest([arrays[0]], beams=[3]), ServedRequest([arrays[0]], length_levels=[9])]
        answers = ServedCaptioner(labert).answer(requests)
        for array, level, answer in zip(arrays, levels, answers, strict=False):
            assert isinstance(answer, list) and answer[0].caption == labert(array, length_level=level)
        assert isinstance(answers[3], RequestError) and "mask-predict" in str(answers[3])
        assert isinstance(answers[4], RequestError)
