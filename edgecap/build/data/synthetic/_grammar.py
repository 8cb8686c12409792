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
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from edgecap.build.data.synthetic._attributes import NUMBER_WORDS, SHAPES
from edgecap.build.data.synthetic._geometry import is_next_to, position_region, spatial_relation
from edgecap.build.data.synthetic._lexicon import (
    BG_ADJECTIVES,
    BG_NOUNS,
    GENERIC,
    IN_IMAGE,
    NEXT_TO,
    OF_IMAGE,
    OPENERS,
    POSITIONS,
    RELATIONS,
    SIZE_WORDS,
    Words,
)
from edgecap.build.data.synthetic._scene import Background, Scene, SceneObject

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


def _article(words: Words) -> Words:
    return ["an" if words[0][0] in "aeiou" else "a", *words]


def _join(items: Sequence[Words]) -> Words:
    """``a b and c`` (captions carry no punctuation, as in Karpathy's cleaned COCO tokens)."""
    out: Words = []
    for k, item in enumerate(items):
        if k == len(items) - 1 and k > 0:
            out.append("and")
        out.extend(item)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Scene facts


class _Facts:
    """Everything true about a scene that the templates may say, computed once per scene."""

    def __init__(self, scene: Scene) -> None:
        self.scene = scene
        self.objects = scene.objects
        self.n = len(scene.objects)
        self.background = scene.background
        self.groups: dict[tuple[str, str], list[SceneObject]] = {}
        for obj in self.objects:
            self.groups.setdefault(obj.pair, []).append(obj)
        self.shape_counts = Counter(o.shape for o in self.objects)
        self.colour_counts = Counter(o.colour for o in self.objects)
        self.regions = {id(o): position_region(o, scene.size) for o in self.objects}
        # Two objects of the same colour and shape can only be told apart by size: relations between them are
        # stated only when their sizes differ (the phrases then always carry the size words).
        self.relations = [
            (a, b, rel)
            for a in self.objects
            for b in self.objects
            if a is not b and self.distinguishable(a, b) and (rel := spatial_relation(a, b, scene.size)) is not None
        ]
        self.adjacent = [
            (a, b) for i, a in enumerate(self.objects) for b in self.objects[i + 1 :] if is_next_to(a, b, scene.size)
        ]
        self.placed = [o for o in self.objects if self.regions[id(o)] is not None]

    @staticmethod
    def distinguishable(a: SceneObject, b: SceneObject) -> bool:
        return a.pair != b.pair or a.size != b.size

    def needs_size(self, obj: SceneObject) -> bool:
        """Whether ``obj`` shares colour and shape with an object of another size (size words tell them apart)."""
        return any(o.size != obj.size for o in self.groups[obj.pair])


class _Grammar:
    """Phrase builders bound to one scene and one random stream."""

    def __init__(self, facts: _Facts, r: random.Random) -> None:
        self.f = facts
        self.r = r
        self.mentioned: set[int] = set()  # ids of objects already named in the caption being built

    def pick(self, options: Sequence[Words]) -> Words:
        return list(options[self.r.randrange(len(options))])

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    # -- noun phrases ----------------------------------------------------------------------------------------------
    def obj_words(self, obj: SceneObject, size: bool) -> Words:
        words = self.pick(SIZE_WORDS[obj.size]) if size else []
        return [*words, obj.colour, obj.shape]

    def obj_np(self, obj: SceneObject, size: bool | None = None, definite: bool | None = None) -> Words:
        """``a (large) red circle``, or ``the ...`` when the colour/shape pair is unique in the scene.

        A unique object named a second time in the same caption is always definite ("... and the red circle is").
        The size is always said when another object of the same colour and shape has a different size.
        """
        unique = len(self.f.groups[obj.pair]) == 1
        if definite is None:
            definite = unique and (id(obj) in self.mentioned or self.chance(0.15))
        self.mentioned.add(id(obj))
        size = (self.chance(0.5) if size is None else size) or self.f.needs_size(obj)
        words = self.obj_words(obj, size)
        return ["the", *words] if definite and unique else _article(words)

    def group_nps(self, pair: tuple[str, str], size: bool, article: bool = True) -> list[Words]:
        """One phrase per group (``two red circles``), or per member when sizes differ and sizes are wanted."""
        members = self.f.groups[pair]
        if len(members) == 1:
            words = self.obj_words(members[0], size)
            return [_article(words) if article else words]
        if size and len({m.size for m in members}) > 1:
            return [_article(self.obj_words(m, True)) if article else self.obj_words(m, True) for m in members]
        colour, shape = pair
        size_words = self.pick(SIZE_WORDS[members[0].size]) if size else []
        return [[NUMBER_WORDS[len(members)], *size_words, colour, SHAPES[shape]]]

    def listing(self, size: bool, article: bool = True, groups: Sequence[tuple[str, str]] | None = None) -> Words:
        pairs = list(self.f.groups) if groups is None else list(groups)
        self.r.shuffle(pairs)
        return _join([np_ for pair in pairs for np_ in self.group_nps(pair, size, article)])

    def count_np(self, n: int | None = None, other: bool = False) -> Words:
        """``three shapes`` / ``two other objects`` / ``one shape``."""
        n = self.f.n if n is None else n
        singular, plural = GENERIC[self.r.randrange(len(GENERIC))]
        noun = singular if n == 1 else plural
        return [NUMBER_WORDS[n], *(["other"] if other else []), noun]

    # -- places and background -----------------------------------------------------------------------------------
    def position(self, obj: SceneObject) -> Words:
        region = self.f.regions[id(obj)]
        assert region is not None
        words = self.pick(POSITIONS[region])
        if self.chance(0.35):
            words += self.pick(OF_IMAGE)
        return words

    def _bg_noun(self) -> Words:
        bg: Background = self.f.background
        words = self.pick(BG_NOUNS[bg.kind])
        if bg.kind == "stripes" and bg.orientation is not None and self.chance(0.8):
            words = [bg.orientation, *words]
        return words

    def background(self) -> Words:
        """A prepositional phrase: ``on a striped background`` / ``with vertical stripes in the background``."""
        form = self.r.randrange(5)
        if form < 3:
            prep = ("on", "against", "over")[form]
            return [prep, *_article([*self.pick(BG_ADJECTIVES[self.f.background.kind]), "background"])]
        if form == 3:
            return ["on", "a", "background", "of", *self._bg_noun()]
        return ["with", *self._bg_noun(), "in", "the", "background"]

    def background_clause(self) -> Words:
        """A full clause: ``the background is striped`` / ``the background has vertical stripes``."""
        kind = self.f.background.kind
        if kind != "gradient" and self.chance(0.5):
            return ["the", "background", "is", *self.pick(BG_ADJECTIVES[kind])]
        return ["the", "background", "has", *self._bg_noun()]

    def opener(self) -> Words:
        return self.pick(OPENERS)

    def there(self, first_np: Words) -> Words:
        plural = first_np[0] in NUMBER_WORDS.values() and first_np[0] != "one"
        return ["there", "are" if plural else "is"]

    def maybe(self, p: float, words: Callable[[], Words]) -> Words:
        return words() if self.chance(p) else []

    # -- clauses ---------------------------------------------------------------------------------------------------
    def relation_words(self, relation: str) -> Words:
        return self.pick(RELATIONS[relation])

    def relation_clause(self, copula: bool) -> Words | None:
        if not self.f.relations:
            return None
        a, b, rel = self.f.relations[self.r.randrange(len(self.f.relations))]
        return [*self.obj_np(a), *(["is"] if copula else []), *self.relation_words(rel), *self.obj_np(b)]

    def position_clause(self, obj: SceneObject, copula: bool) -> Words:
        return [*self.obj_np(obj), *(["is"] if copula else []), *self.position(obj)]

    def count_clause(self) -> Words:
        if self.f.n == 1:
            return self.pick((["there", "is", "only", "one", "shape"], ["there", "is", "a", "single", "object"]))
        return ["there", "are", *self.count_np()]


# ----------------------------------------------------------------------------------------------------------------
# Templates: each returns a caption or None when the scene lacks the facts it needs


def _t_bare(g: _Grammar) -> Words | None:
    """``red circle and blue star`` / ``two red circles and a blue star``: the shortest captions."""
    if len(g.f.groups) > 3:
        return None
    headline = g.f.n == len(g.f.groups) and g.chance(0.6)  # "red circle and blue star" only without plurals
    return g.listing(size=g.chance(0.3), article=not headline)


def _t_opener_listing(g: _Grammar) -> Words | None:
    return [*g.opener(), *g.listing(size=g.chance(0.5)), *g.maybe(0.5, g.background)]


def _t_there_listing(g: _Grammar) -> Words | None:
    listing = g.listing(size=g.chance(0.5))
    return [*g.there(listing), *listing, *g.maybe(0.4, lambda: g.pick(IN_IMAGE)), *g.maybe(0.4, g.background)]


def _t_count(g: _Grammar) -> Words | None:
    """``three shapes on a grainy background`` / ``a single shape``."""
    if g.f.n == 1:
        head = g.pick((["a", "single", "shape"], ["a", "single", "object"], ["one", "shape"]))
    else:
        head = g.count_np()
    if g.chance(0.3):
        head = [*g.opener(), *head]
    return [*head, *g.maybe(0.6, g.background)]


def _t_count_including(g: _Grammar) -> Words | None:
    """``four shapes including two red circles and a blue star``."""
    if g.f.n == 1:
        return None
    pairs = list(g.f.groups)
    chosen = g.r.sample(pairs, g.r.randint(1, len(pairs)))
    head = g.count_np() if g.chance(0.5) else ["there", "are", *g.count_np()]
    words = [*head, *g.maybe(0.3, g.background), "including", *g.listing(size=g.chance(0.4), groups=chosen)]
    return words


def _t_others(g: _Grammar) -> Words | None:
    """``a large red circle and two other shapes``."""
    if g.f.n == 1:
        return None
    obj = g.r.choice(g.f.objects)
    link = g.pick((["and"], ["with"], ["among"]))
    return [*g.obj_np(obj), *link, *g.count_np(g.f.n - 1, other=True), *g.maybe(0.4, g.background)]


def _t_shape_counts(g: _Grammar) -> Words | None:
    """``two circles and a star``: per-shape counts, colour left out."""
    article = g.chance(0.7)  # "a star" or "one star", the same for every item of the caption
    items = [
        _article([shape]) if k == 1 and article else [NUMBER_WORDS[k], shape if k == 1 else SHAPES[shape]]
        for shape, k in g.f.shape_counts.items()
    ]
    g.r.shuffle(items)
    body = _join(items)
    head = g.pick(([], g.there(body), g.opener()))
    return [*head, *body, *g.maybe(0.4, g.background)]


def _t_colour_counts(g: _Grammar) -> Words | None:
    """``two red shapes and one blue shape``: per-colour counts, shape left out."""
    singular, plural = GENERIC[g.r.randrange(len(GENERIC))]
    article = g.chance(0.5)
    items = [
        [
            *(_article([colour]) if k == 1 and article else [NUMBER_WORDS[k], colour]),
            singular if k == 1 else plural,
        ]
        for colour, k in g.f.colour_counts.items()
    ]
    g.r.shuffle(items)
    body = _join(items)
    head = g.pick(([], g.there(body), g.opener()))
    return [*head, *body, *g.maybe(0.5, g.background)]


def _t_relation(g: _Grammar) -> Words | None:
    """``a red circle is to the left of a small blue star on a striped background``."""
    copula = g.chance(0.6)
    clause = g.relation_clause(copula)
    if clause is None:
        return None
    head = g.maybe(0.3, g.opener) if not copula else []
    return [*head, *clause, *g.maybe(0.5, g.background)]


def _t_next_to(g: _Grammar) -> Words | None:
    """``a red circle and a blue star next to each other`` / ``a red circle is beside a blue star``."""
    if not g.f.adjacent:
        return None
    a, b = g.f.adjacent[g.r.randrange(len(g.f.adjacent))]
    if g.chance(0.5):
        a, b = b, a
    side_by_side = g.pick((["next", "to", "each", "other"], ["side", "by", "side"]))
    if a.pair == b.pair and a.size == b.size:
        if len(g.f.groups[a.pair]) != 2:
            return None
        return [*g.group_nps(a.pair, size=g.chance(0.5))[0], *side_by_side, *g.maybe(0.5, g.background)]
    if g.chance(0.4):
        words = [*g.obj_np(a), "and", *g.obj_np(b), *side_by_side]
    else:
        words = [*g.obj_np(a), *g.maybe(0.5, lambda: ["is"]), *g.pick(NEXT_TO), *g.obj_np(b)]
    return [*words, *g.maybe(0.5, g.background)]


def _t_positions(g: _Grammar) -> Words | None:
    """``a large red circle in the top left corner and a blue star at the bottom``."""
    if not g.f.placed:
        return None
    objs = g.r.sample(g.f.placed, g.r.randint(1, len(g.f.placed)))
    copula = g.chance(0.5)
    body = _join([g.position_clause(o, copula) for o in objs])
    head = [] if copula else g.maybe(0.5, g.opener)
    if len(objs) == 1 and g.f.n == 1 and not copula and g.chance(0.5):
        body = ["a", "single", *body[1:]] if body[0] in ("a", "an") else body
    return [*head, *body, *g.maybe(0.5, g.background)]


def _t_compound(g: _Grammar) -> Words | None:
    """Two or three clauses joined by ``and``: counts, a relation, a position, the background."""
    clauses: list[Words] = []
    if g.chance(0.6):
        clauses.append(g.count_clause())
    relation = g.relation_clause(copula=True) if g.chance(0.6) else None
    if relation is not None:
        clauses.append(relation)
    if g.f.placed and (g.chance(0.5) or len(clauses) < 2):
        clauses.append(g.position_clause(g.r.choice(g.f.placed), copula=True))
    if g.chance(0.6) or len(clauses) < 2:
        clauses.append(g.background_clause())
    if len(clauses) < 2:
        return None
    words = clauses[0]
    for clause in clauses[1:]:
        words = [*words, "and", *clause]
    return words


def _t_single(g: _Grammar) -> Words | None:
    """One object, said at length: ``in this image we can see a single large purple ring near the bottom ...``."""
    if g.f.n != 1 or not g.f.placed:
        return None
    obj = g.f.objects[0]
    head = g.pick((g.opener(), ["there", "is"], []))
    body = [*g.pick((["a", "single"], ["only", "one"], ["one"])), *g.obj_words(obj, size=g.chance(0.8))]
    return [*head, *body, *g.position(obj), *g.maybe(0.8, g.background)]


def _t_detailed(g: _Grammar) -> Words | None:
    """The long form: every object with size and colour (and often its place), plus the background."""
    with_places = g.chance(0.5) and len(g.f.placed) == g.f.n
    if with_places:
        objs = list(g.f.objects)
        g.r.shuffle(objs)
        body = _join([[*g.obj_np(o, size=g.chance(0.8)), *g.position(o)] for o in objs])
    else:
        body = g.listing(size=True)
    head = g.pick((g.opener(), g.there(body), [*g.opener(), *g.count_np()], []))
    if head and head[-1] in ("shapes", "objects", "shape", "object"):
        head += g.pick((["namely"], ["including"]))
    return [*head, *body, *g.maybe(0.7, g.background)]


_TEMPLATES: dict[str, Callable[[_Grammar], Words | None]] = {
    "bare": _t_bare,
    "opener_listing": _t_opener_listing,
    "there_listing": _t_there_listing,
    "count": _t_count,
    "count_including": _t_count_including,
    "others": _t_others,
    "shape_counts": _t_shape_counts,
    "colour_counts": _t_colour_counts,
    "relation": _t_relation,
    "next_to": _t_next_to,
    "positions": _t_positions,
    "compound": _t_compound,
    "detailed": _t_detailed,
    "single": _t_single,
}


# ----------------------------------------------------------------------------------------------------------------
# Selection


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
