"""compare_decoders: caption/token agreement and the CIDEr-D delta between two decoders on the same images."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgecap.runtime.decoding import DecodeCfg
from edgecap.runtime.vocab import WordVocab
from edgecap.workshop.evaluation import cider_d
from edgecap.workshop.export.calibration import compare_decoders
from edgecap.workshop.export.calibration.quality import QualityInputError, token_agreement

VOCAB = WordVocab(["a", "b", "c", "d"])  # PAD 0, BOS 1, EOS 2, UNK 3, a=4, b=5, c=6, d=7
CFG = DecodeCfg.for_vocab(VOCAB, strategy="greedy", max_len=5)
REFERENCE_SCRIPTS = [[4, 5, 2], [6, 7, 2], [5, 2]]  # "a b", "c d", "b"


class Scripted:
    """Row i of the batch follows ``scripts[inputs["script"][i]]`` token by token."""

    def __init__(self, scripts: list[list[int]]) -> None:
        self.scripts = scripts

    def encode(self, inputs):
        script = torch.as_tensor(inputs["script"]).long()
        return {"script": script, "t": torch.zeros_like(script)}

    def step(self, tokens, state):
        logprobs = torch.full((tokens.shape[0], VOCAB.size), -20.0)
        for row, (script, t) in enumerate(zip(state["script"].tolist(), state["t"].tolist(), strict=True)):
            sequence = self.scripts[script]
            logprobs[row, sequence[min(t, len(sequence) - 1)]] = 0.0
        return logprobs, {"script": state["script"], "t": state["t"] + 1}

    def select(self, state, index):  # the search's int64 numpy rows, converted like TorchStepModel does
        return {k: v.index_select(0, torch.from_numpy(index)) for k, v in state.items()}


def batches() -> list[dict[str, np.ndarray]]:
    return [{"script": np.array([0, 1])}, {"script": np.array([2])}]


REFERENCES = [["a b", "a b c"], ["c d"], ["b", "b d"]]


def test_token_agreement_is_positional_over_the_longer_sequence() -> None:
    assert token_agreement([4, 5], [4, 5]) == 1.0
    assert token_agreement([4, 5], [4, 6]) == 0.5
    assert token_agreement([4, 5, 6, 7], [4, 5]) == 0.5
    assert token_agreement([5, 4], [4, 5]) == 0.0
    assert token_agreement([], []) == 1.0


def test_identical_decoders_agree_completely() -> None:
    report = compare_decoders(
        Scripted(REFERENCE_SCRIPTS), Scripted(REFERENCE_SCRIPTS), batches(), REFERENCES, VOCAB, CFG
    )
    assert report["images"] == 3
    assert report["caption_agreement_pct"] == 100.0 and report["token_agreement_pct"] == 100.0
    assert report["cider_d_delta"] == 0.0 and report["cider_d_reference"] == report["cider_d_candidate"] > 0
    assert report["differing_examples"] == []


def test_a_changed_caption_is_counted_and_scored() -> None:
    candidate = Scripted([[4, 5, 2], [6, 4, 2], [5, 2]])  # image 1: "c a" instead of "c d"
    report = compare_decoders(Scripted(REFERENCE_SCRIPTS), candidate, batches(), REFERENCES, VOCAB, CFG)
    assert report["caption_agreement_pct"] == pytest.approx(100 * 2 / 3)
    assert report["token_agreement_pct"] == pytest.approx(100 * (1 + 0.5 + 1) / 3)
    refs = dict(enumerate(REFERENCES))
    expected_ref = cider_d({0: "a b", 1: "c d", 2: "b"}, refs)
    expected_cand = cider_d({0: "a b", 1: "c a", 2: "b"}, refs)
    assert report["cider_d_reference"] == pytest.approx(expected_ref)
    assert report["cider_d_delta"] == pytest.approx(expected_cand - expected_ref) and report["cider_d_delta"] < 0
    assert report["differing_examples"] == [{"image": 1, "reference": "c d", "candidate": "c a"}]


def test_without_references_there_is_no_cider() -> None:
    report = compare_decoders(Scripted(REFERENCE_SCRIPTS), Scripted(REFERENCE_SCRIPTS), batches(), None, VOCAB, CFG)
    assert "cider_d_delta" not in report and report["mean_length_reference"] == pytest.approx(5 / 3)


@pytest.mark.parametrize(
    ("inputs", "references", "message"),
    [
        ([], None, "no images"),
        (batches(), REFERENCES[:2], "2 reference entries for 3 images"),
        (batches(), ["a b", "c d", "b"], "got a str"),
    ],
)
def test_inputs_that_cannot_be_compared(inputs, references, message: str) -> None:
    with pytest.raises(QualityInputError, match=message):
        compare_decoders(Scripted(REFERENCE_SCRIPTS), Scripted(REFERENCE_SCRIPTS), inputs, references, VOCAB, CFG)


def test_the_fp32_graphs_agree_with_themselves(acort, region_feeds) -> None:
    from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model

    fp32 = acort.fp32
    refs = [["w1 w2 w3", "w4"]] * 8
    with (
        create_onnxruntime_step_model(fp32["encoder"], fp32["step"]) as a,
        create_onnxruntime_step_model(fp32["encoder"], fp32["step"]) as b,
    ):
        report = compare_decoders(a, b, region_feeds(2, seed=4), refs, acort.vocab, acort.cfg("beam", beam_size=2))
    assert report["images"] == 8 and report["caption_agreement_pct"] == 100.0 and report["cider_d_delta"] == 0.0
