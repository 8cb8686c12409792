"""SCST rewards: CIDEr-D (n = 4, σ = 6) with document frequencies from the training references, plus an optional
BLEU-4 term (ACORT's "C1B0001" reward: CIDEr-D weight 1 + BLEU-4 weight 1).

Document frequencies come once from the training split (Rennie et al. 2017 and every SCST code base derived from it
do the same: the reward of a sample does not depend on which other images share its batch). CIDEr-D is the fast
vectorised scorer of :mod:`edgecap.workshop.evaluation.cider`; BLEU-4 is pycocoevalcap's sentence-level ``BleuScorer``
("closest" reference length), the scorer the COCO toolkit reports.

EOS handling. ExpansionNet v2 scores EOS as a word: the sampled caption keeps its EOS and every reference gets one
appended (its SacreEOS signature ``STANDARDwInit``), which rewards ending a caption where references end.
ACORT scores decoded words only. ``eos_word=True`` is the first, ``False`` the second; in both the policy-gradient
loss includes the EOS log-probability (:func:`edgecap.workshop.training.scst.scst_loss`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgecap.workshop.evaluation.cider import CiderD

__all__ = ["EOS_WORD", "CaptionReward", "sentence_bleu4"]

#: The word that stands for EOS in rewards; ``clean_caption`` strips ``<`` and ``>``, so no caption word equals it.
EOS_WORD = "<eos>"

Words = Sequence[str]


def sentence_bleu4(candidates: Sequence[Words], refs: Sequence[Sequence[Words]]) -> np.ndarray:
    """(C,) sentence-level BLEU-4 of every candidate against its references (pycocoevalcap's ``BleuScorer``)."""
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer

    if len(candidates) != len(refs):
        raise ValueError(f"got {len(candidates)} candidates but {len(refs)} reference lists")
    if not candidates:
        return np.zeros(0, dtype=np.float64)
    scorer = BleuScorer(n=4)
    for cand, group in zip(candidates, refs, strict=True):
        scorer += (" ".join(cand), [" ".join(r) for r in group])
    _, per_order = scorer.compute_score(option="closest", verbose=0)
    return np.asarray(per_order[3], dtype=np.float64)


class CaptionReward:
    """Reward of sampled captions: ``cider_weight · CIDEr-D + bleu_weight · BLEU-4`` (pycocoevalcap scales).

    Args:
        train_refs: every training image's reference captions, as word lists; their n-grams give the CIDEr-D
            document frequencies.
        bleu_weight: weight of sentence BLEU-4 (ACORT uses 1.0; 0 disables it and skips the BLEU computation).
        cider_weight: weight of CIDEr-D.
        eos_word: score EOS as a word (ExpansionNet v2) or decoded words only (ACORT); see the module docstring.
    """

    def __init__(
        self,
        train_refs: Sequence[Sequence[Words]],
        *,
        bleu_weight: float = 0.0,
        cider_weight: float = 1.0,
        eos_word: bool = False,
    ) -> None:
        if bleu_weight < 0 or cider_weight < 0 or bleu_weight + cider_weight == 0:
            raise ValueError(
                f"reward weights must be >= 0 and not both 0, got CIDEr-D {cider_weight}, BLEU-4 {bleu_weight}"
            )
        self.bleu_weight, self.cider_weight, self.eos_word = float(bleu_weight), float(cider_weight), bool(eos_word)
        self.cider = CiderD([self.references(group) for group in train_refs], n=4, sigma=6.0)

    def references(self, group: Sequence[Words]) -> list[list[str]]:
        """An image's references as the reward sees them (with EOS appended when ``eos_word``)."""
        tail = [EOS_WORD] if self.eos_word else []
        return [[*ref, *tail] for ref in group]

    def candidate(self, words: Words, finished: bool) -> list[str]:
        """A sampled caption as the reward sees it: its words, plus EOS when ``eos_word`` and it ended with EOS."""
        return [*words, EOS_WORD] if self.eos_word and finished else list(words)

    def __call__(self, candidates: Sequence[Words], refs: Sequence[Sequence[Words]]) -> np.ndarray:
        """(C,) rewards; ``candidates``/``refs`` already in reward form (:meth:`candidate`, :meth:`references`).
        Several candidates of one image should share one ``refs`` list object (scored once)."""
        total = np.zeros(len(candidates), dtype=np.float64)
        if self.cider_weight:
            total += self.cider_weight * self.cider.score(candidates, refs)
        if self.bleu_weight:
            total += self.bleu_weight * sentence_bleu4(candidates, refs)
        return total
