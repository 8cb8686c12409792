"""Length-control and diversity metrics of LaBERT §4.6: control precision per level (Fig. 4a) and Div-1, Div-2 and
SelfCIDEr (Table 4).

- **Control precision** of level l: the fraction of captions generated at level l whose word count lies in
  ``[L_low, L_high]``.
- **Div-n** (Shetty et al. 2017, as used in Table 4): for each image, the number of distinct n-grams over its set of
  captions (here: one per level, or the beams of a beam search) divided by the number of words in the set; averaged
  over images.
- **SelfCIDEr** (Wang & Chan, CVPR 2019, "Describing like humans"): for each image's m captions the CIDEr-D kernel
  ``K_ij = CIDEr-D(c_i | refs = [c_j])`` (document frequencies from all images' caption sets), its eigenvalues
  ``λ``, and ``−log_m(√λ_max / Σ √λ_i)``; 0 for identical captions, 1 for captions that share nothing. Averaged over
  images. Written here because no library ships it; the kernel uses :class:`~edgecap.workshop.evaluation.cider.CiderD`
  (pycocoevalcap's CIDEr-D, number for number).

Captions are tokenised with :func:`edgecap.runtime.text.clean_caption`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from edgecap.runtime.text import clean_caption
from edgecap.workshop.evaluation.cider import CiderD

__all__ = ["control_precision", "diversity", "div_n", "length_histogram", "self_cider"]


def control_precision(captions: Sequence[str], low: int, high: int) -> float:
    """Fraction of ``captions`` with ``low <= words <= high`` (0.0 for no captions)."""
    if low > high:
        raise ValueError(f"need low <= high, got [{low}, {high}]")
    if not captions:
        return 0.0
    return sum(low <= len(clean_caption(c)) <= high for c in captions) / len(captions)


def length_histogram(captions: Sequence[str]) -> dict[int, int]:
    """Word count -> number of captions."""
    out: dict[int, int] = {}
    for c in captions:
        n = len(clean_caption(c))
        out[n] = out.get(n, 0) + 1
    return dict(sorted(out.items()))


def _ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def div_n(caption_sets: Mapping[str, Sequence[str]], n: int) -> float:
    """Mean over images of (distinct n-grams in the image's captions) / (words in the image's captions)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    scores = []
    for captions in caption_sets.values():
        tokens = [clean_caption(c) for c in captions]
        words = sum(len(t) for t in tokens)
        if words:
            scores.append(len({g for t in tokens for g in _ngrams(t, n)}) / words)
    return float(np.mean(scores)) if scores else 0.0


def self_cider(caption_sets: Mapping[str, Sequence[str]]) -> float:
    """Mean SelfCIDEr over images with at least two captions (see the module docstring)."""
    sets = {k: [clean_caption(c) for c in v] for k, v in caption_sets.items() if len(v) >= 2}
    if not sets:
        raise ValueError("SelfCIDEr needs at least one image with two or more captions")
    scorer = CiderD(list(sets.values()))
    scores = []
    for tokens in sets.values():
        m = len(tokens)
        cands = [tokens[i] for i in range(m) for _ in range(m)]
        refs = [[tokens[j]] for _ in range(m) for j in range(m)]
        kernel = scorer.score(cands, refs).reshape(m, m)
        kernel = (kernel + kernel.T) / 2  # CIDEr-D's clipping makes it slightly asymmetric
        eig = np.clip(np.linalg.eigvalsh(kernel), 0.0, None)
        root = np.sqrt(eig)
        if root.sum() <= 0:
            scores.append(0.0)  # every n-gram has zero IDF (in every image's set): generic captions, no diversity
            continue
        scores.append(float(-math.log(root.max() / root.sum()) / math.log(m)))
    return float(np.mean(scores))


def diversity(caption_sets: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """Table 4's three numbers: ``{"self_cider", "div_1", "div_2"}``."""
    return {"self_cider": self_cider(caption_sets), "div_1": div_n(caption_sets, 1), "div_2": div_n(caption_sets, 2)}
