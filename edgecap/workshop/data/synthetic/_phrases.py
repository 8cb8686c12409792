"""The grammar's facts and phrases: what is true about one scene (:class:`_Facts`) and the noun phrases, clauses
and random wording built from it (:class:`_Grammar`), which the caption templates (:mod:`._templates`) combine."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence

from edgecap.workshop.data.synthetic._attributes import NUMBER_WORDS, SHAPES
from edgecap.workshop.data.synthetic._geometry import is_next_to, position_region, spatial_relation
from edgecap.workshop.data.synthetic._lexicon import (
    BG_ADJECTIVES,
    BG_NOUNS,
    GENERIC,
    OF_IMAGE,
    OPENERS,
    POSITIONS,
    RELATIONS,
    SIZE_WORDS,
    Words,
)
from edgecap.workshop.data.synthetic._scene import Background, Scene, SceneObject


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
