"""SCST recipes: a paper's by name, or a JSON file over one, read and checked by one loader (the CLI's and
``TrainCfg.with_scst_recipe``'s), so a recipe means the same in both and a bad one fails before training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgecap.workshop.training.config import (
    SCST_RECIPE_KEYS,
    SCST_RECIPES,
    ScstRecipeError,
    TrainCfg,
    load_scst_recipe,
)


def test_named_recipes_are_valid_and_a_file_starts_from_its_base(tmp_path: Path) -> None:
    for name, recipe in SCST_RECIPES.items():
        assert load_scst_recipe(name) == recipe
        assert load_scst_recipe(dict(recipe)) == recipe  # every value of the papers' recipes passes the checks
    path = tmp_path / "step4.json"
    path.write_text(json.dumps({"scst_lr": 2e-6, "scst_anneal": 1}))
    assert load_scst_recipe(path) == {**SCST_RECIPES["v2"], "scst_lr": 2e-6, "scst_anneal": 1}
    path.write_text(json.dumps({"base": "acort", "scst_samples": 3, "scst_eos_word": True}))
    cfg = TrainCfg().with_scst_recipe(str(path))
    assert cfg.scst_samples == 3 and cfg.scst_eos_word and cfg.scst_optimizer == "adam" and cfg.scst_batch_size == 5
    assert set(SCST_RECIPES["acort"]) == set(SCST_RECIPE_KEYS)


@pytest.mark.parametrize(
    ("recipe", "said"),
    [
        ("v3", "neither an SCST recipe (v2, acort) nor a recipe file"),
        ({"base": "v3"}, "base 'v3' is not one of v2, acort"),
        ({"scst_lr": 1e-4, "lr": 1e-4}, "unknown key(s) lr"),
        ({"scst_lr": float("nan")}, "scst_lr must be a number > 0, not NaN"),
        ({"scst_lr": "1e-4"}, 'scst_lr must be a number > 0, not "1e-4"'),
        ({"scst_anneal": 0}, "scst_anneal must be a number in (0, 1]"),
        ({"scst_samples": 2.5}, "scst_samples must be an integer >= 1"),
        ({"scst_samples": True}, "scst_samples must be an integer >= 1"),
        ({"scst_batch_size": 0}, "scst_batch_size must be an integer >= 1"),
        ({"scst_baseline": "mean"}, 'scst_baseline must be "loo"'),
        ({"scst_eos_word": 1}, "scst_eos_word must be true or false"),
        ({"scst_bleu_weight": -1}, "scst_bleu_weight must be a number >= 0"),
    ],
)
def test_bad_recipes_say_what_is_wrong_in_one_line(tmp_path: Path, recipe: object, said: str) -> None:
    if isinstance(recipe, dict):
        path = tmp_path / "recipe.json"
        path.write_text(json.dumps(recipe))
        recipe = path
    with pytest.raises(ScstRecipeError) as caught:
        TrainCfg().with_scst_recipe(recipe)  # type: ignore[arg-type]
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_file_that_is_not_a_json_object_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "recipe.toml"
    path.write_text("scst_lr = 1e-4\n")
    with pytest.raises(ScstRecipeError, match="not a readable JSON file"):
        load_scst_recipe(path)
    path.write_text("[1, 2]")
    with pytest.raises(ScstRecipeError, match="holds list, not a JSON object"):
        load_scst_recipe(path)
