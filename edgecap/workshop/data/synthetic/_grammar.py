"""The caption grammar: several differently phrased, true descriptions of a scene, spread over caption lengths.

Each template realises facts computed from the scene geometry (attributes, exact counts, spatial relations with a
margin, grid positions, background texture) with random wording (openers, synonyms, optional details). A pool of
candidates is drawn per image and one caption is picked per target length level, so that every LaBERT length level
(§3.1, the 4-level plan: 1-9, 10-14, 15-19, 20-25 words) is well represented in the training captions.

Grammar rules that keep captions true:

* counts ("two red circles", "three shapes", "two other shapes") are exact counts over the whole scene;
* "the <colour> <shape>" is only used when that colour/shape combination is unique in the scene;
* a size word in a plural phrase ("two small red circles") is used only when every member has that size;
* relations and positions come from :mod:`._geometry` and are omitted when borderline.

The facts and phrase builders live in :mod:`._phrases`, the templates in :mod:`._templates`; this module plans the
lengths and picks the captions.
"""

from __future__ import annotations

import random

import numpy as np

from edgecap.workshop.data.synthetic._phrases import _Facts, _Grammar
from edgecap.workshop.data.synthetic._scene import Scene
from edgecap.workshop.data.synthetic._templates import _TEMPLATES

__all__ = ["LENGTH_LEVELS", "MAX_CAPTION_WORDS", "describe_scene", "length_level"]

# LaBERT (Deng et al. 2020) §3.1, 4-level plan: caption length ranges in words, from rough to detailed.
LENGTH_LEVELS: tuple[tuple[int, int], ...] = ((1, 9), (10, 14), (15, 19), (20, 25))
MAX_CAPTION_WORDS = LENGTH_LEVELS[-1][1]
# Extra captions beyond one per level are drawn with these level weights (shorter captions are more common).
_EXTRA_LEVEL_WEIGHTS = (0.4, 0.3, 0.2, 0.1)


def length_level(num_words: int) -> int:
    """Index (0..3) of the LaBERT length level holding a caption of ``num_words`` words."""
    for level, (low, high) in enumerate(LENGTH_LEVELS):
        if low <= num_words <= high:
            return level
    raise ValueError(f"a caption of {num_words} words is outside the length levels {LENGTH_LEVELS}")


def _candidates(g: _Grammar, count: int) -> list[tuple[str, tuple[str, ...]]]:
    names = list(_TEMPLATES)
    out = []
    for _ in range(count):
        name = names[g.r.randrange(len(names))]
        g.mentioned.clear()
        words = _TEMPLATES[name](g)
        if words and len(words) <= MAX_CAPTION_WORDS:
            out.append((name, tuple(words)))
    return out


def describe_scene(scene: Scene, rng: np.random.Generator, n: int = 5) -> list[list[str]]:
    """``n`` distinct reference captions of ``scene``, each 1..25 words, phrased with different templates.

    The first ``min(n, 4)`` captions target the four LaBERT length levels in turn (nearest available level when a
    scene cannot fill one); further captions draw their level with weights 40/30/20/10 %.

    Args:
        scene: the ground truth.
        rng: randomness for wording (one draw seeds a fast ``random.Random`` for the many small choices).
        n: captions to return, 1..20.

    Returns:
        ``n`` lists of lower-case word tokens, no punctuation.
    """
    if not 1 <= n <= 20:
        raise ValueError(f"captions per image must be in 1..20, got {n}")
    r = random.Random(int(rng.integers(2**63)))
    g = _Grammar(_Facts(scene), r)
    levels = [0, 1, 2, 3][:n]
    r.shuffle(levels)
    levels += r.choices(range(len(LENGTH_LEVELS)), weights=_EXTRA_LEVEL_WEIGHTS, k=n - len(levels))

    pool: dict[int, list[tuple[str, tuple[str, ...]]]] = {k: [] for k in range(len(LENGTH_LEVELS))}
    chosen: list[tuple[str, ...]] = []
    used_templates: set[str] = set()
    for round_ in range(8):
        for name, words in _candidates(g, 48 if round_ == 0 else 96):
            pool[length_level(len(words))].append((name, words))
        while len(chosen) < n:
            target = levels[len(chosen)]
            pick = None
            for level in sorted(pool, key=lambda k: (abs(k - target), k)):
                fresh = [c for c in pool[level] if c[1] not in chosen]
                if fresh:
                    varied = [c for c in fresh if c[0] not in used_templates] or fresh
                    pick = varied[r.randrange(len(varied))]
                    break
            if pick is None:
                break  # pool exhausted: draw more candidates
            used_templates.add(pick[0])
            chosen.append(pick[1])
        if len(chosen) == n:
            return [list(c) for c in chosen]
    raise ValueError(f"could not phrase {n} distinct captions for a scene with {len(scene.objects)} objects")
