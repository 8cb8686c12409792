"""``benchmarks/side_by_side.py``'s official-code column, on fake official checkouts (CI has no official code and
downloads nothing).

The fakes are shaped like the surface the cell runner (``benchmarks/official_code.py``) uses of the real
repositories, at the commits pinned in ``official_code.OFFICIAL_CODE``:

- ``jiahuei/sparse-image-captioning``: ``sparse_caption/models/relation_transformer.py`` with
  ``RelationTransformerModel(config)`` and its ``forward(att_feats=, boxes=, att_masks=, opt={"beam_size": K},
  mode="sample") -> (seq (B, K, max_seq_length), logprobs)`` (``CaptionModel.forward`` dispatching to
  ``RelationTransformerModel._sample``); the module's imports ``from . import register_model``,
  ``from .transformer import ...``, ``from ..data.collate import ObjectRelationCollate`` and
  ``from ..utils.model_utils import ...``; plus ``transformer.py``, ``caption_model.py``, ``utils/model_utils.py``,
  ``utils/misc.py``. The fake package ``__init__`` files and ``data/collate.py`` raise on import, as the real ones
  need the training and data dependencies (sentencepiece, requests, six, torchvision): the runner must not import them.
- ``jchenghu/ExpansionNet_v2``: ``models/ExpansionNet_v2.py`` with ``ExpansionNet_v2(d_model=, N_enc=, N_dec=, ff=,
  num_heads=, num_exp_enc_list=, num_exp_dec=, output_word2idx=, output_idx2word=, max_seq_len=, drop_args=,
  img_feature_dim=, rank=)`` and ``forward(enc_x=, enc_x_num_pads=, mode="beam_search", beam_size=,
  beam_max_seq_len=, how_many_outputs=, sample_or_max=, sos_idx=, eos_idx=) -> (per image a list of token lists
  starting with sos, logprobs)`` (``CaptioningModel.forward`` -> ``CaptioningModel.beam_search``), importing
  ``models.layers``, ``models.captioning_model`` and ``utils.masking`` by top-level names.

Each fake records the arguments it was built and called with, so the tests check the settings the runner passes.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.scripts import load_script

#: The base classes are ``torch.nn.Module``s: calling the model runs ``forward``.
NN_MODULE_CALL = """
class CaptionModel:
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)
"""
RAISES = "raise ImportError('the runner must import only the model modules')\n"

ACORT_MODEL = """
import json
import os
from . import register_model
from .transformer import CachedTransformerBase
from ..data.collate import ObjectRelationCollate
from ..utils.model_utils import repeat_tensors

RECORD = os.path.join(os.path.dirname(__file__), "..", "..", "calls.json")


@register_model("relation_transformer")
class RelationTransformerModel(CachedTransformerBase):
    COLLATE_FN = ObjectRelationCollate

    def __init__(self, config):
        import torch

        self.config = config
        self.first = torch.rand(1).item()  # the runner seeds the official init

    def eval(self):
        return self

    def forward(self, *args, **kwargs):
        mode = kwargs.pop("mode", "forward")
        return getattr(self, "_" + mode)(*args, **kwargs)

    def _sample(self, att_feats, boxes, att_masks=None, opt=None, **kwargs):
        import torch

        c = self.config
        beam = max(opt.get("beam_size", 1), 1)
        with open(RECORD, "a") as f:
            f.write(json.dumps({"config": vars(c), "feats": list(att_feats.shape), "boxes": list(boxes.shape),
                                "masks": str(att_masks.dtype), "opt": opt, "first": self.first}) + "\\n")
        seq = torch.ones(att_feats.shape[0], beam, c.max_seq_length, dtype=torch.long)
        return seq, torch.zeros(seq.shape)
"""

EXPANSIONNET_MODEL = """
import json
import os
from models.layers import EncoderLayer
from models.captioning_model import CaptioningModel
from utils.masking import create_pad_mask

RECORD = os.path.join(os.path.dirname(__file__), "..", "calls.json")


class ExpansionNet_v2(CaptioningModel):
    def __init__(self, d_model, N_enc, N_dec, ff, num_heads, num_exp_enc_list, num_exp_dec,
                 output_word2idx, output_idx2word, max_seq_len, drop_args, img_feature_dim=2048, rank=0):
        self.args = {"d_model": d_model, "N_enc": N_enc, "N_dec": N_dec, "ff": ff, "num_heads": num_heads,
                     "num_exp_enc_list": num_exp_enc_list, "num_exp_dec": num_exp_dec,
                     "vocab": len(output_word2idx), "max_seq_len": max_seq_len, "drop": vars(drop_args),
                     "img_feature_dim": img_feature_dim, "rank": rank}

    def eval(self):
        return self

    def forward(self, enc_x, dec_x=None, enc_x_num_pads=[0], dec_x_num_pads=[0], apply_log_softmax=False,
                mode="forward", **kwargs):
        with open(RECORD, "a") as f:
            f.write(json.dumps({"args": self.args, "enc_x": list(enc_x.shape), "pads": enc_x_num_pads,
                                "mode": mode, "kwargs": kwargs}) + "\\n")
        length = kwargs["beam_max_seq_len"]
        pred = [[[kwargs["sos_idx"]] + [5] * (length - 1)] for _ in range(enc_x.shape[0])]
        return pred, None
"""


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def fake_acort(root: Path) -> Path:
    """A checkout shaped like ``jiahuei/sparse-image-captioning`` where it matters to the runner."""
    return _write(
        root,
        {
            "sparse_caption/__init__.py": RAISES,
            "sparse_caption/models/__init__.py": RAISES,
            "sparse_caption/data/__init__.py": RAISES,
            "sparse_caption/data/collate.py": RAISES,
            "sparse_caption/utils/__init__.py": RAISES,
            "sparse_caption/models/relation_transformer.py": ACORT_MODEL,
            "sparse_caption/models/transformer.py": "from .caption_model import CaptionModel as "
            "CachedTransformerBase\n",
            "sparse_caption/models/caption_model.py": "from ..utils import model_utils\n\n" + NN_MODULE_CALL,
            "sparse_caption/utils/model_utils.py": "def repeat_tensors(n, x):\n    return x\n",
            "sparse_caption/utils/misc.py": "",
        },
    )


def fake_expansionnet(root: Path) -> Path:
    """A checkout shaped like ``jchenghu/ExpansionNet_v2`` where it matters to the runner."""
    return _write(
        root,
        {
            "models/__init__.py": "",
            "models/ExpansionNet_v2.py": EXPANSIONNET_MODEL,
            "models/layers.py": "class EncoderLayer:\n    pass\n",
            "models/captioning_model.py": NN_MODULE_CALL.replace("CaptionModel", "CaptioningModel"),
            "utils/masking.py": "def create_pad_mask():\n    pass\n",
        },
    )


@pytest.fixture(scope="module")
def script():  # type: ignore[no-untyped-def]
    return load_script("side_by_side")


def _cell(model: str, steps: int, checkout: Path, kind: str, beam: int = 3, batch: int = 2) -> dict:
    return {
        "model": model, "steps": steps, "threads": 1, "batch": batch, "beam": beam, "column": "official",
        "dir": str(checkout / "unused"), "seed": 0, "setting": "paper", "warmup": 1, "repeats": 2,
        "session_config": {}, "official": {"kind": kind, "path": str(checkout)},
    }  # fmt: skip


def _calls(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_acort_cell_runs_the_official_decode_in_a_fresh_process(script, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    checkout = fake_acort(tmp_path / "sparse-image-captioning")
    result = script._run_child(_cell("acort-xsmall", 26, checkout, "acort"), "--cell", 300)
    assert "error" not in result, result
    assert result["captions_per_s"] > 0 and len(result["times_s"]) == 2 and result["mean_tokens"] == 26
    assert result["official"]["repo"] == "jiahuei/sparse-image-captioning"
    calls = _calls(checkout / "calls.json")
    assert len(calls) == 3  # 1 warm-up + 2 timed, one model build
    config = calls[0]["config"]
    sizes = (config["d_model"], config["dim_feedforward"], config["num_heads"], config["num_layers"])
    assert sizes == (256, 1024, 8, 2)
    assert config["share_layer_encoder"] == config["share_layer_decoder"] == [0, 0]
    assert config["share_att_encoder"] == config["share_att_decoder"] == "kv"
    assert (config["vocab_size"], config["att_feat_size"], config["max_seq_length"]) == (771, 2048, 26)
    assert config["bos_token_id"] == 769 and config["eos_token_id"] >= config["vocab_size"]  # never emitted
    assert calls[0]["feats"] == [2, 49, 2048] and calls[0]["boxes"] == [2, 49, 4]
    assert calls[0]["masks"] == "torch.float32"
    assert calls[0]["opt"] == {"beam_size": 3}
    # the same draw of features and the same seeded init on a second run
    again = script._run_child(_cell("acort-xsmall", 26, checkout, "acort"), "--cell", 300)
    assert again["tokens_sha1"] == result["tokens_sha1"]
    assert _calls(checkout / "calls.json")[3]["first"] == calls[0]["first"]


def test_expansionnet_cell_forces_the_length_through_the_end_token(script, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    checkout = fake_expansionnet(tmp_path / "ExpansionNet_v2")
    result = script.run_cell(_cell("expansionnet-test", 7, checkout, "expansionnet", beam=1, batch=1))
    assert result["mean_tokens"] == 7  # the start token is not counted
    (call, *_) = _calls(checkout / "calls.json")
    assert call["mode"] == "beam_search" and call["pads"] == [0]
    kwargs = call["kwargs"]
    assert kwargs["beam_size"] == 1 and kwargs["beam_max_seq_len"] == 8 and kwargs["how_many_outputs"] == 1
    assert kwargs["eos_idx"] < 0  # never emitted: no hypothesis ends early
    from edgecap.models import get_model_cfg

    cfg = get_model_cfg("expansionnet-test")
    args = call["args"]
    assert (args["d_model"], args["N_enc"], args["N_dec"], args["num_exp_dec"]) == (
        cfg.d_model, cfg.enc_layers, cfg.dec_layers, cfg.dec_slots,
    )  # fmt: skip
    assert args["num_exp_enc_list"] == list(cfg.enc_groups) and args["rank"] == "cpu"
    assert set(args["drop"].values()) == {0.0}


def test_checkouts_are_checked_and_missing_ones_noted(script, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import official_code

    acort = fake_acort(tmp_path / "a")
    args = script.parse_args(["--official-acort", str(acort)])
    found, notes = script.official_checkouts(args, [("acort-xsmall", 26), ("expansionnet-v2", 19), ("labert-test", 5)])
    assert found == {"acort-xsmall": {"kind": "acort", "path": str(acort.resolve())}}
    assert any("expansionnet-v2: not run (no --official-expansionnet PATH" in n for n in notes)
    assert any("labert-test: no official code" in n for n in notes)
    with pytest.raises(ValueError, match="missing models/ExpansionNet_v2.py"):
        official_code.check_checkout("expansionnet", acort)
    with pytest.raises(SystemExit):
        script.official_checkouts(script.parse_args(["--official-expansionnet", str(acort)]), [("expansionnet-v2", 19)])


def test_table_gives_ratios_against_the_official_code(script) -> None:  # type: ignore[no-untyped-def]
    assert script.columns_for(["fp32"], official=True) == ["official", "baseline", "torch", "ort-fp32"]
    cells = {
        "official": script.aggregate([{"captions_per_s": 10.0, "tokens_sha1": "x"}]),
        "baseline": script.aggregate([{"captions_per_s": 5.0, "tokens_sha1": "a"}]),
        "ort-fp32": script.aggregate([{"captions_per_s": 60.0, "tokens_sha1": "a"}]),
    }
    manifest = {"variants": {"fp32": {"precision": "fp32"}}}
    assert script._same_tokens(cells, manifest)  # the official column has its own weights: not compared
    row = {"label": "acort-xsmall, beam 3", "batch": 1, "threads": 1, "cells": cells, "same_tokens": True}
    report = {"columns": list(cells), "rows": [row], "rounds": 1, "warmup": 2, "repeats": 7,
              "official_notes": ["expansionnet-v2: not run"]}  # fmt: skip
    text = script.markdown(report)
    assert "| official code | re-run-prefix stand-in (no cache) | edgecap ORT fp32 |" in text
    assert "| 10.0 | 5.00 (0.5×) | 60.0 (6.0×) |" in text and "ratios vs the official code." in text
    assert "Official code: expansionnet-v2: not run" in text


@pytest.mark.slow
def test_quick_run_has_the_official_column_first(script, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    checkout = fake_acort(tmp_path / "sparse-image-captioning")
    out, work = tmp_path / "out", tmp_path / "work"
    argv = ["--quick", "--beam", "3", "--no-limit", "--variants", "fp32", "--official-acort", str(checkout)]
    assert script.main([*argv, "--work", str(work), "--out", str(out)]) == 0
    report = json.loads((out / "side_by_side.json").read_text())
    assert report["columns"] == ["official", "baseline", "torch", "ort-fp32"]
    assert report["official"] == {"acort-test": {"kind": "acort", "path": str(checkout.resolve())}}
    (row,) = report["rows"]
    assert row["cells"]["official"]["captions_per_s"] > 0 and row["same_tokens"]
    config = _calls(checkout / "calls.json")[0]["config"]
    assert (config["d_model"], config["max_seq_length"]) == (32, 6)  # acort-test's config, the quick length
    assert "ratios vs the official code." in (out / "side_by_side.md").read_text()
