"""ServedCaptioner: one reply or one error per request, captions equal to Captioner's, whatever the batch-mates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgecap.runtime.captioner import Captioner
from edgecap.runtime.serving.batch import ServedCaptioner, ServedRequest
from edgecap.runtime.serving.protocol import CaptionReply, RequestBusyError, RequestError
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


def test_an_image_over_the_pixel_limit_is_refused_alone_before_decoding(
    captioner: Captioner, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import ImageFile

    arrays = images(2, seed=5)
    big = np.zeros((60, 61, 3), np.uint8)  # 3660 pixels
    served = ServedCaptioner(captioner, max_pixels=3000)
    decoded = []
    original = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: decoded.append(self.size) or original(self))
    answers = served.answer([ServedRequest([png(big)]), ServedRequest([arrays[0]]), ServedRequest([big])])
    assert isinstance(answers[0], RequestError) and "61×60 = 3660 pixels" in str(answers[0])
    assert isinstance(answers[2], RequestError) and "limit of 3000 pixels" in str(answers[2])
    assert not isinstance(answers[0], RequestBusyError)
    assert (61, 60) not in decoded  # refused from the PNG header
    assert isinstance(answers[1], list) and answers[1][0].caption == captioner(arrays[0])


def test_the_batch_byte_budget_turns_away_what_does_not_fit_beside_its_batch_mates(captioner: Captioner) -> None:
    arrays = images(3, seed=6)  # each under 9 KB
    budget = arrays[0].nbytes + arrays[1].nbytes
    served = ServedCaptioner(captioner, max_batch_bytes=budget)
    huge = np.zeros((80, 80, 3), np.uint8)  # alone over the budget: never fits, so not "busy"
    answers = served.answer([ServedRequest([a]) for a in arrays] + [ServedRequest([huge])])
    assert [a[0].caption for a in answers[:2] if isinstance(a, list)] == captioner.batch(arrays[:2])
    assert isinstance(answers[2], RequestBusyError) and "send the request again" in str(answers[2])
    assert isinstance(answers[3], RequestError) and not isinstance(answers[3], RequestBusyError)
    (alone,) = served.answer([ServedRequest([arrays[2]])])  # the next batch has room for it
    assert isinstance(alone, list) and alone[0].caption == captioner(arrays[2])
