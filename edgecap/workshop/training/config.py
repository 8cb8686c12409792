"""Training configuration: one frozen dataclass, serialisable into the run directory."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TrainCfg:
    """Cross-entropy training recipe (ACORT §5.1 / reference `training.py` defaults where they apply).

    The reference recipe is Adam(0.9, 0.999, 1e-8) with the Noam schedule (warm-up 10k steps at
    batch 15×5 on COCO) and value clipping at 0.1; ``optimizer="radam"`` is the ExpansionNet v2 choice.
    Defaults here are scaled for the synthetic set on a 2-core CPU.
    """

    model: str = "acort-xsmall"
    data: str = ""
    features: str = ""
    out: str = ""
    model_overrides: dict[str, Any] = field(default_factory=dict)
    vocab_min_count: int = 5
    max_words: int = 25
    epochs: int = 15
    batch_size: int = 32  # images per batch; each image contributes `captions_per_image` captions
    captions_per_image: int = 5
    optimizer: str = "adam-noam"  # "adam-noam" | "radam" | "adamw" | "adamw-cosine" (LaBERT)
    lr: float = 1e-3  # peak lr (for adam-noam: reached at the end of warm-up, then ∝ 1/sqrt(step))
    warmup_steps: int = 100
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    grad_clip: float = 1.0  # max global grad norm (0 disables)
    grad_clip_mode: str = "norm"  # "norm" | "value" (the reference clips values at 0.1)
    val_every: int = 1
    val_images: int = 0  # 0 = the whole val split
    val_beam: int = 1
    seed: int = 0
    device: str = "auto"
    save_every_steps: int = 200
    max_steps: int = 0  # 0 = no limit (used by tests and time-boxed runs)
    max_minutes: float = 0.0  # 0 = no limit; stops cleanly after the running epoch's step
    # End-to-end fine-tuning after the frozen-backbone stage (ExpansionNet v2 §4.3;
    # edgecap/workshop/training/end_to_end.py).
    finetune_epochs: int = 0  # 0 = off; v2 uses 2
    finetune_lr: float = 3e-5
    finetune_anneal: float = 0.55  # lr factor per epoch
    finetune_batch_size: int = 0  # images per batch; 0 = batch_size
    backbone_weights: str = ""  # the cache's backbone weights file, when it came from a local file (e.g. a Swin)
    # Self-critical sequence training after the cross-entropy epochs (edgecap/workshop/training/scst_loop.py). Defaults
    # are ExpansionNet v2 §4.3's recipe; `SCST_RECIPES["acort"]` holds ACORT §5.1's.
    scst_epochs: int = 0  # 0 = off
    scst_lr: float = 1e-4
    scst_anneal: float = 0.8  # lr factor per SCST epoch
    scst_optimizer: str = "radam"  # "radam" (v2) | "adam" (ACORT)
    scst_batch_size: int = 0  # images per batch; 0 = batch_size
    scst_samples: int = 5  # K captions sampled per image
    scst_baseline: str = "loo"  # "loo" (leave-one-out mean) | "greedy"
    scst_max_words: int = 20
    scst_bleu_weight: float = 0.0  # ACORT's C1B0001 reward: 1.0
    scst_loss_norm: str = "sequence"  # "sequence" (v2) | "token" (ACORT)
    scst_eos_word: bool = True  # EOS scored as a word (v2) or decoded words only (ACORT)
    scst_max_steps: int = 0  # 0 = no limit (tests, time-boxed runs)
    # Knowledge distillation from a trained teacher run (edgecap/workshop/compression/distill.py); "" = none.
    teacher: str = ""
    kd_mode: str = "word"  # "word" | "sequence" | "both"
    kd_temperature: float = 2.0
    kd_alpha: float = 0.5  # weight of the word-level KD term
    kd_beam: int = 3  # beam of the teacher's captions (sequence level)

    def with_scst_recipe(self, recipe: str | Path | Mapping[str, Any]) -> TrainCfg:
        """This cfg with an SCST recipe filled in: a paper's (:data:`SCST_RECIPES`), a JSON file or a mapping, read
        by :func:`load_scst_recipe` (the loader of ``edgecap train --scst-recipe`` and ``train scst --recipe``)."""
        return self.replace(**load_scst_recipe(recipe))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainCfg:
        """Read a stored cfg; runs written before a field existed get its default."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown training options: {sorted(unknown)}")
        return cls(**data)

    def replace(self, **changes: Any) -> TrainCfg:
        return dataclasses.replace(self, **changes)

    @property
    def out_dir(self) -> Path:
        return Path(self.out)


#: SCST recipes of the papers, by name (CLI ``--scst-recipe``/``--recipe``; a recipe file may start from one).
SCST_RECIPES: dict[str, dict[str, Any]] = {
    # ExpansionNet v2 §4.3: 5 samples, leave-one-out baseline, RAdam lr 1e-4 annealed by 0.8 per epoch, max 20
    # words, loss averaged over (image, sample), EOS scored as a word.
    "v2": {
        "scst_lr": 1e-4,
        "scst_anneal": 0.8,
        "scst_optimizer": "radam",
        "scst_samples": 5,
        "scst_baseline": "loo",
        "scst_max_words": 20,
        "scst_bleu_weight": 0.0,
        "scst_loss_norm": "sequence",
        "scst_eos_word": True,
    },
    # ACORT §5.1: 15 samples, leave-one-out ("sample") baseline, Adam lr 5e-5 without decay, batch 5 images,
    # reward CIDEr-D + BLEU-4, loss averaged over tokens, rewards on decoded words.
    "acort": {
        "scst_lr": 5e-5,
        "scst_anneal": 1.0,
        "scst_optimizer": "adam",
        "scst_batch_size": 5,
        "scst_samples": 15,
        "scst_baseline": "loo",
        "scst_max_words": 20,
        "scst_bleu_weight": 1.0,
        "scst_loss_norm": "token",
        "scst_eos_word": False,
    },
}


class ScstRecipeError(ValueError):
    """An SCST recipe that is not a known name, not a readable JSON object, or has an unknown key or a bad value."""


def _finite(low: float, high: float = math.inf, *, low_open: bool = False) -> Any:
    def check(value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        return (value > low if low_open else value >= low) and value <= high

    return check


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _one_of(*choices: str) -> Any:
    return lambda value: value in choices


#: Each key an SCST recipe may set (the TrainCfg field), what it accepts, and how that reads in an error.
SCST_RECIPE_KEYS: dict[str, tuple[Any, str]] = {
    "scst_lr": (_finite(0, low_open=True), "a number > 0"),
    "scst_anneal": (_finite(0, 1, low_open=True), "a number in (0, 1]: the lr factor per epoch"),
    "scst_optimizer": (_one_of("radam", "adam"), '"radam" or "adam"'),
    "scst_batch_size": (_count, "an integer >= 1: images per batch"),
    "scst_samples": (_count, "an integer >= 1: captions sampled per image"),
    "scst_baseline": (_one_of("loo", "greedy"), '"loo" (leave-one-out) or "greedy"'),
    "scst_max_words": (_count, "an integer >= 1"),
    "scst_bleu_weight": (_finite(0), "a number >= 0: the BLEU-4 weight in the reward"),
    "scst_loss_norm": (_one_of("sequence", "token"), '"sequence" or "token"'),
    "scst_eos_word": (lambda value: isinstance(value, bool), "true or false: EOS scored as a word"),
}


def load_scst_recipe(recipe: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """The TrainCfg fields of an SCST recipe: a name of :data:`SCST_RECIPES`, a JSON file, or a mapping.

    A file or mapping holds keys of :data:`SCST_RECIPE_KEYS` and optionally ``"base"``, the named recipe it starts
    from (default ``v2``), e.g. ``{"base": "acort", "scst_samples": 3}``. One loader for the CLI and Python, so a
    recipe means the same in both; every key and value is checked here, before any training starts.

    Raises:
        ScstRecipeError: an unknown name, an unreadable or non-JSON file, an unknown key or a bad value.
    """
    if isinstance(recipe, str) and recipe in SCST_RECIPES:
        return dict(SCST_RECIPES[recipe])
    if isinstance(recipe, Mapping):
        return _resolve(dict(recipe), "the SCST recipe")
    path = Path(recipe)
    if not path.is_file():
        raise ScstRecipeError(f"{recipe} is neither an SCST recipe ({', '.join(SCST_RECIPES)}) nor a recipe file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScstRecipeError(f"SCST recipe {path} is not a readable JSON file: {exc}") from None
    if not isinstance(data, dict):
        raise ScstRecipeError(f"SCST recipe {path} holds {type(data).__name__}, not a JSON object of recipe keys")
    return _resolve(data, f"SCST recipe {path}")


def _resolve(data: dict[str, Any], where: str) -> dict[str, Any]:
    base = data.pop("base", "v2")
    if base not in SCST_RECIPES:
        raise ScstRecipeError(f"{where}: base {base!r} is not one of {', '.join(SCST_RECIPES)}")
    unknown = sorted(set(data) - set(SCST_RECIPE_KEYS))
    if unknown:
        raise ScstRecipeError(
            f"{where}: unknown key(s) {', '.join(unknown)}; a recipe sets base, {', '.join(SCST_RECIPE_KEYS)}"
        )
    for key, value in data.items():
        check, expected = SCST_RECIPE_KEYS[key]
        if not check(value):
            raise ScstRecipeError(f"{where}: {key} must be {expected}, not {json.dumps(value)}")
    return {**SCST_RECIPES[base], **data}
