"""The caption templates: each phrases one kind of description (a listing, counts, relations, positions, ...) with
the phrase builders of :mod:`._phrases`, or returns None when the scene lacks the facts it needs."""

from __future__ import annotations

from collections.abc import Callable

from edgecap.workshop.data.synthetic._attributes import NUMBER_WORDS, SHAPES
from edgecap.workshop.data.synthetic._lexicon import GENERIC, IN_IMAGE, NEXT_TO, Words
from edgecap.workshop.data.synthetic._phrases import _article, _Grammar, _join


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
