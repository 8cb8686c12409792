"""Synthetic caption sets shared by the evaluation tests: random-ish but COCO-like, so n-grams overlap."""

from __future__ import annotations

import random

import pytest

_SUBJECTS = ["a man", "a woman", "two dogs", "a cat", "a group of people", "a little child", "a red bus", "an old car"]
_VERBS = ["sitting on", "standing next to", "riding", "walking along", "looking at", "playing with", "lying on"]
_OBJECTS = ["a bench", "the street", "a skateboard", "a wooden table", "the beach", "a field of grass", "a fence"]
_EXTRAS = ["", "", "in the sun", "at night", "with a hat", "near the water", "on a sunny day"]


def _variant(rng: random.Random, scene: tuple[str, str, str]) -> list[str]:
    subject, verb, obj = scene
    if rng.random() < 0.3:
        subject = rng.choice(_SUBJECTS)
    if rng.random() < 0.3:
        verb = rng.choice(_VERBS)
    if rng.random() < 0.2:
        obj = rng.choice(_OBJECTS)
    words = f"{subject} {verb} {obj} {rng.choice(_EXTRAS)}".split()
    if len(words) > 3 and rng.random() < 0.3:
        del words[rng.randrange(len(words))]
    return words


def make_tokenised_set(
    num_images: int, num_refs: int = 5, seed: int = 0
) -> tuple[dict[str, list[str]], dict[str, list[list[str]]]]:
    """Candidates and references as word tokens, keyed ``img{i}``.

    Candidates include paraphrases, exact copies of a reference, unrelated captions, empty and one-word captions
    and repeated words (which exercise CIDEr-D's clipping).
    """
    rng = random.Random(seed)
    cands: dict[str, list[str]] = {}
    refs: dict[str, list[list[str]]] = {}
    for i in range(num_images):
        key = f"img{i}"
        scene = (rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS))
        refs[key] = [_variant(rng, scene) for _ in range(num_refs)]
        kind = i % 7
        if kind == 0:
            cands[key] = list(rng.choice(refs[key]))
        elif kind == 1:
            other = (rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS))
            cands[key] = _variant(rng, other)
        elif kind == 2 and i % 3 == 0:
            cands[key] = []
        elif kind == 3:
            cands[key] = [rng.choice(scene[0].split())]
        elif kind == 4:
            words = _variant(rng, scene)
            cands[key] = words[:2] * 3 + words
        else:
            cands[key] = _variant(rng, scene)
    return cands, refs


def make_raw_set(num_images: int, num_refs: int = 5, seed: int = 0) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The same kind of set as raw captions: capitals, punctuation, apostrophes, hyphens, a newline, an empty one."""
    rng = random.Random(seed + 1000)
    cands, refs = make_tokenised_set(num_images, num_refs, seed)

    def dress(words: list[str]) -> str:
        if not words:
            return ""
        text = " ".join(words)
        if rng.random() < 0.3:
            text = text.replace(" a ", " a man's ", 1)
        if rng.random() < 0.2:
            text = text.replace(" ", ", ", 1)
        if rng.random() < 0.2:
            text = text.replace("wooden", "well-made wooden")
        if rng.random() < 0.1:
            text = f'"{text}"'
        text = text[0].upper() + text[1:]
        return text + rng.choice([".", ".", "", "!", " ."])

    raw_cands = {key: dress(words) for key, words in cands.items()}
    raw_refs = {key: [dress(words) for words in group] for key, group in refs.items()}
    first = next(iter(raw_cands))
    raw_cands[first] = raw_cands[first].replace(" ", "\n", 1) or "A\nman"
    return raw_cands, raw_refs


@pytest.fixture(scope="session")
def tokenised_set() -> tuple[dict[str, list[str]], dict[str, list[list[str]]]]:
    """50 images x 5 references, tokenised."""
    return make_tokenised_set(50)
