"""Registry, ObjectRelationCfg and parameter counts at the paper's setting (ACORT Table 1)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

import edgecap.workshop.models._registry as registry
from edgecap.workshop.models import (
    PAPER_FEATURE_DIM,
    PAPER_WORD_VOCAB_SIZE,
    CaptionModel,
    ModelCfgError,
    ObjectRelationCfg,
    UnknownModelError,
    cfg_from_dict,
    count_model_parameters,
    count_parameters,
    create_model,
    create_model_from_cfg,
    describe_models,
    edge_settings,
    get_model_cfg,
    list_models,
    model_family,
    paper_params,
    paper_settings,
    register_model,
)

# ACORT Table 1 (millions); acort-xsmall from the text ("55.44M -> 2.57M").
TABLE_1 = {
    "ort-base": 55.4,
    "ort-base-4": 40.7,
    "ort-base-2": 26.0,
    "ort-small": 16.7,
    "ort-xsmall": 4.1,
    "acort-base": 15.0,
    "acort-base-al": 8.4,
    "acort-small": 4.2,
    "acort-xsmall": 2.57,
}
# Exact totals of the reference: model_params.json of the published ACORT-base/small checkpoints; a recount of the
# released code's layers otherwise.
EXACT = {"acort-base": 14_979_347, "acort-small": 4_213_779, "acort-xsmall": 2_567_435, "ort-base": 55_443_777}


def closed_form_params(cfg: ObjectRelationCfg, vocab_size: int, feature_dim: int) -> int:
    """Closed-form parameter count, generalised over the configs: what ORT/ACORT count, shared layers once."""
    d, f = cfg.d_model, cfg.d_ff
    linear = d * d + d
    attention = (3 if cfg.share_att else 4) * linear
    ffn = d * f + f + f * d + d
    norm = 2 * d
    w_g = cfg.heads * (cfg.geometry_dim + 1) if cfg.geometry else 0
    encoder_layer = attention + ffn + 2 * norm + w_g
    decoder_layer = 2 * attention + ffn + 3 * norm
    unique_enc, unique_dec = max(cfg.enc_layer_map) + 1, max(cfg.dec_layer_map) + 1
    feature_embed = feature_dim * d + d
    return (
        unique_enc * encoder_layer
        + unique_dec * decoder_layer
        + 2 * norm  # final encoder and decoder LayerNorms
        + feature_embed
        + vocab_size * d  # input embedding
        + d * vocab_size
        + vocab_size  # untied output projection
        + ((len(cfg.length_levels) + 1) * d if cfg.length_levels else 0)  # level embedding (Eq. 2), row 0 unused
    )


# -- listing and lookup ----------------------------------------------------------------------------------------


def test_all_paper_and_test_configs_are_registered():
    names = list_models()
    assert names == sorted(names)
    assert set(TABLE_1) | {"ort-test", "acort-test", "acort-test-qk"} <= set(names)
    assert list_models("acort-*") == [n for n in names if n.startswith("acort-")]
    assert list_models("*-test*") == [
        "acort-test",
        "acort-test-len",
        "acort-test-qk",
        "acort-test-ref",
        "expansionnet-test",
        "expansionnet-test-len",
        "image-transformer-test",
        "image-transformer-test-len",
        "image-transformer-test-ref",
        "labert-test",
        "ort-test",
        "ort-test-ref",
    ]
    assert list_models("nothing-*") == []
    assert {model_family(n) for n in names} == {"ort", "labert", "expansionnet", "image_transformer"}
    assert list_models("labert-*") == [
        "labert-base",
        "labert-base-5level",
        "labert-small",
        "labert-test",
        "labert-xsmall",
    ]


def test_unknown_model_suggests_close_names():
    with pytest.raises(UnknownModelError, match="did you mean acort-small"):
        get_model_cfg("acort-smal")
    with pytest.raises(ValueError):
        create_model("resnet-50", 10)


@pytest.mark.parametrize("name", list(TABLE_1))
def test_registered_configs_follow_table_1(name):
    cfg = get_model_cfg(name)
    assert isinstance(cfg, ObjectRelationCfg) and cfg.heads == 8 and cfg.geometry
    if name.startswith("acort"):
        assert cfg.vocab_kind == "radix" and cfg.radix_base == 768 and cfg.share_att == "kv"
        assert cfg.max_len >= 2 * 20 + 1  # radix: 2 tokens per word
    else:
        assert cfg.vocab_kind == "word" and cfg.share_att is None
        assert len(set(cfg.enc_layer_map)) == cfg.enc_layers  # baselines share nothing
    assert cfg.layer_norm == "standard" and cfg.box_wh_offset == 0.0  # fresh-model defaults, not the reference quirks
    assert get_model_cfg("acort-base").enc_layer_map == (0, 0, 0, 1, 1, 1)
    assert get_model_cfg("acort-xsmall").dec_layer_map == (0, 0)
    assert get_model_cfg("acort-base-al").enc_layer_map == (0,) * 6


# -- ObjectRelationCfg (ModelCfg) -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list_models())
def test_cfg_json_round_trip(name):
    cfg = get_model_cfg(name)
    data = json.loads(json.dumps(cfg.to_dict()))
    assert type(cfg).from_dict(data) == cfg
    assert cfg_from_dict(data) == cfg
    assert json.loads(json.dumps(dataclasses.asdict(cfg)))["d_model"] == cfg.d_model  # contract: asdict is JSON-able
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 3  # type: ignore[misc]


def test_cfg_rejects_bad_values():
    with pytest.raises(ModelCfgError, match="divisible"):
        ObjectRelationCfg(d_model=30, heads=8)
    with pytest.raises(ModelCfgError, match="share_att"):
        ObjectRelationCfg(share_att="vk")
    with pytest.raises(ModelCfgError, match="enc_layer_map"):
        ObjectRelationCfg(enc_layer_map="(0x3,2x3)")
    with pytest.raises(ModelCfgError, match="vocab_kind"):
        ObjectRelationCfg(vocab_kind="bpe")
    with pytest.raises(ModelCfgError, match="dropout"):
        ObjectRelationCfg(dropout=1.5)
    with pytest.raises(ModelCfgError, match="layer_norm"):
        ObjectRelationCfg(layer_norm="rms")
    with pytest.raises(ModelCfgError, match="max_len"):
        ObjectRelationCfg(max_len=0)
    with pytest.raises(ModelCfgError, match="unknown model config field"):
        ObjectRelationCfg.from_dict({"family": "ort", "d_modle": 8}, source="run/config.json")
    with pytest.raises(ModelCfgError, match="run/config.json"):
        ObjectRelationCfg.from_dict({"heads": 0}, source="run/config.json")
    with pytest.raises(ModelCfgError, match="family"):
        cfg_from_dict({"d_model": 8})
    with pytest.raises(UnknownModelError, match="family"):
        cfg_from_dict({"family": "lstm"})
    assert ObjectRelationCfg(share_att="none").share_att is None  # CLI spelling of "no sharing"


# -- create_model ------------------------------------------------------------------------------------------------------


def test_create_model_applies_overrides():
    model = create_model("acort-test", 771, feature_dim=20, enc_layer_map="(0x3)", dropout=0.0)
    assert isinstance(model, CaptionModel)
    assert model.cfg.feature_dim == model.feature_dim == 20
    assert model.cfg.enc_layer_map == (0, 0, 0) and model.cfg.dropout == 0.0
    assert model.vocab_size == 771
    assert model.feature_embed[0].in_features == 20
    assert get_model_cfg("acort-test").enc_layer_map == (0, 0)  # the registered cfg is untouched

    no_share = create_model("acort-test", 771, share_att=None)  # None is a real value for share_att...
    assert no_share.cfg.share_att is None
    kept = create_model("acort-test", 771, d_model=None)  # ...but means "not given" elsewhere
    assert kept.cfg.d_model == 32
    from_json = create_model("ort-test", 30, dec_layer_map=[0, 0, 1])  # JSON lists from run configs
    assert from_json.cfg.dec_layer_map == (0, 0, 1)


def test_create_model_rejects_bad_arguments():
    with pytest.raises(ModelCfgError, match="unknown override"):
        create_model("ort-test", 30, depth=3)
    with pytest.raises(ModelCfgError, match=r"771 classes .* vocab_size=30.*radix_base=27"):
        create_model("acort-test", 30)
    assert create_model("acort-test", 30, radix_base=27).vocab_size == 30
    with pytest.raises(ModelCfgError, match="vocab_size"):
        create_model("ort-test", 1)


def test_create_model_from_cfg_rebuilds_the_same_architecture():
    model = create_model("acort-test-qk", 19, feature_dim=12, radix_base=16)
    again = create_model_from_cfg(cfg_from_dict(json.loads(json.dumps(model.cfg.to_dict()))), 19)
    assert again.cfg == model.cfg
    assert {k: v.shape for k, v in again.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    again.load_state_dict(model.state_dict())


def test_register_model_extends_the_registry(monkeypatch):
    monkeypatch.setattr(registry, "_VARIANTS", dict(registry._VARIANTS))

    @register_model(paper_params=1.0e5)
    def acort_tiny_custom() -> ObjectRelationCfg:
        return dataclasses.replace(get_model_cfg("acort-test"), d_model=16)

    assert "acort-tiny-custom" in list_models()
    assert paper_params("acort-tiny-custom") == 1.0e5
    assert create_model("acort-tiny-custom", 771).cfg.d_model == 16
    with pytest.raises(ValueError, match="already registered"):
        register_model(name="acort-tiny-custom")(lambda: get_model_cfg("acort-test"))


# -- parameter counts (ACORT Table 1) ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TABLE_1))
def test_parameter_count_matches_table_1(name):
    settings = paper_settings(name)
    cfg = get_model_cfg(name)
    assert settings["feature_dim"] == PAPER_FEATURE_DIM == 2048
    assert settings["vocab_size"] == (771 if cfg.vocab_kind == "radix" else PAPER_WORD_VOCAB_SIZE)
    count = count_model_parameters(name, **settings)
    reported = TABLE_1[name] * 1e6
    assert abs(count - reported) / reported < 0.03, f"{name}: {count:,} vs Table 1 {reported:,.0f}"
    assert count == closed_form_params(cfg, **settings)
    if name in EXACT:
        assert count == EXACT[name]
    assert paper_params(name) == pytest.approx(reported)


@pytest.mark.parametrize("name", [n for n in list_models() if model_family(n) == "ort"])
def test_counts_at_any_setting_follow_the_formula(name):
    count = count_model_parameters(name, **edge_settings(name))
    assert count == closed_form_params(get_model_cfg(name), **edge_settings(name))


def test_meta_count_equals_a_real_model_and_dedups_shared_layers():
    real = create_model("acort-test-qk", 771, feature_dim=40)
    assert count_parameters(real) == count_model_parameters("acort-test-qk", 771, feature_dim=40)
    shared = count_model_parameters("ort-test", 50, enc_layer_map="(0x6)")
    assert shared == count_model_parameters("ort-test", 50, enc_layer_map="(0)")  # 6 positions, 1 layer counted
    with torch.device("meta"):
        assert all(p.is_meta for p in create_model("ort-base", 10001).parameters())
    assert count_parameters(nn.Linear(3, 2)) == 8


def test_settings_helpers():
    assert paper_settings("ort-base") == {"vocab_size": 10001, "feature_dim": 2048}
    assert paper_settings("acort-small") == {"vocab_size": 771, "feature_dim": 2048}
    assert edge_settings("ort-small") == {"vocab_size": 124, "feature_dim": 1280}
    assert edge_settings("ort-small", vocab_size=60, feature_dim=320) == {"vocab_size": 60, "feature_dim": 320}
    assert edge_settings("acort-small", vocab_size=60) == {"vocab_size": 771, "feature_dim": 1280}


def test_describe_models_rows():
    rows = describe_models("acort-base*")
    assert [r["name"] for r in rows] == ["acort-base", "acort-base-al", "acort-base-len", "acort-base-ref"]
    assert rows[2]["params_paper"] == EXACT["acort-base"] + 5 * 512  # the level embedding: 4 levels + unused row 0
    base = rows[0]
    assert base["params_paper"] == EXACT["acort-base"]
    assert base["paper_reported"] == pytest.approx(15.0e6)
    assert base["params_edge"] == count_model_parameters("acort-base", 771, 1280)
    assert base["enc_layer_map"] == "(0x3,1x3)" and base["enc_unique"] == 2 and base["share_att"] == "kv"
    json.dumps(rows)


def test_the_object_relation_cfg_keeps_its_old_name() -> None:
    from edgecap.workshop.models import ModelCfg

    assert ModelCfg is ObjectRelationCfg and get_model_cfg("acort-test").family == "ort"


@pytest.mark.parametrize("family", ["ort", "expansionnet", "labert"])
def test_family_hooks_agree_with_what_the_family_trains_decodes_and_exports(family: str) -> None:
    """The hooks are where a family's behaviour lives: the objective, the torch adapter and the export spec they
    name are the ones used, and the decoding they declare is the one the export spec writes graphs for."""
    from edgecap.workshop.export import get_export_spec
    from edgecap.workshop.models import family_hooks
    from edgecap.workshop.torch_runtime.captioning import decoder_for
    from edgecap.workshop.training.objectives import objective_for

    name = next(n for n in list_models("*-test") if model_family(n) == family)
    model = create_model(name, **edge_settings(name, feature_dim=8)).eval()
    hooks = family_hooks(model)
    assert hooks is family_hooks(family)
    assert objective_for(model) is hooks.resolve("objective")
    assert type(decoder_for(model)) is hooks.resolve("torch_decoder")
    assert get_export_spec(model).decoding == hooks.decoding


def test_family_hooks_are_checked_when_registered() -> None:
    from edgecap.workshop.models import FamilyHooks

    with pytest.raises(ValueError, match="decoding must be one of"):
        FamilyHooks(decoding="beam")
    with pytest.raises(ValueError, match="package.module:attr"):
        FamilyHooks(objective="no_colon")
    with pytest.raises(TypeError, match="FamilyHooks"):
        registry.register_family("x", object, lambda cfg, v: None, hooks={"decoding": "autoregressive"})  # type: ignore[arg-type]
    with pytest.raises(UnknownModelError, match="no export_spec hook"):
        FamilyHooks().resolve("export_spec")
