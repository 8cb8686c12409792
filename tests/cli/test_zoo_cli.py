"""``edgecap zoo``: one smoke test per output form via click's CliRunner."""

from __future__ import annotations

import json

from click.testing import CliRunner

from edgecap.cli.zoo import zoo
from edgecap.workshop.models import list_models


def test_zoo_table_lists_every_model():
    result = CliRunner().invoke(zoo, [])
    assert result.exit_code == 0, result.output
    for name in list_models():
        assert name in result.output
    assert "14.98M" in result.output  # acort-base at the paper's setting
    assert "55.44M" in result.output  # ort-base
    assert "(0x3,1x3)" in result.output and "radix 768" in result.output


def test_zoo_json_has_counts_and_architecture():
    result = CliRunner().invoke(zoo, ["acort-*", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert set(rows) == set(list_models("acort-*"))
    base = rows["acort-base"]
    assert base["params_paper"] == 14_979_347
    assert base["paper_reported"] == 15.0e6
    assert base["edge_settings"] == {"vocab_size": 771, "feature_dim": 1280}
    assert base["d_model"] == 512 and base["enc_layers"] == 6 and base["enc_unique"] == 2
    assert base["share_att"] == "kv" and base["dec_layer_map"] == "(0x3,1x3)"


def test_zoo_edge_settings_follow_options():
    runner = CliRunner()
    small = json.loads(runner.invoke(zoo, ["ort-test", "--json", "--vocab-size", "50"]).output)[0]
    large = json.loads(runner.invoke(zoo, ["ort-test", "--json", "--vocab-size", "150", "--feature-dim", "64"]).output)[
        0
    ]
    assert small["edge_settings"] == {"vocab_size": 50, "feature_dim": 1280}
    assert large["edge_settings"] == {"vocab_size": 150, "feature_dim": 64}
    d = small["d_model"]
    assert large["params_edge"] - small["params_edge"] == 100 * (2 * d + 1) + (64 - 1280) * d
    assert small["params_paper"] == large["params_paper"]


def test_zoo_unknown_pattern_fails_clearly():
    result = CliRunner().invoke(zoo, ["nothing-*"])
    assert result.exit_code != 0
    assert "no registered model matches 'nothing-*'" in result.output
