"""The official ACORT and ExpansionNet v2 code as a column of ``side_by_side.py``: built and decoded from a checkout.

Nothing of the official repositories is in edgecap: the user passes a checkout (``--official-acort PATH``,
``--official-expansionnet PATH``) at the commit in :data:`OFFICIAL_CODE`, and a cell process imports the official
*model modules* from it (only those: not the training, data or evaluation code, so the official requirements beyond
torch and numpy are not needed), builds the official model with the row's architecture (edgecap's config of the same
model: for ``acort-xsmall`` the paper's d=256, d_ff=1024, 8 heads, 2 layers sharing one, Share-KV) at the paper
settings with the official random initialisation (seeded), and times the official decode function with its own beam
search, on the same features as the edgecap columns of the row:

- ACORT (``jiahuei/sparse-image-captioning``): ``RelationTransformerModel(config)(att_feats=, boxes=, att_masks=,
  opt={"beam_size": K}, mode="sample")``, i.e. ``CachedTransformerBase._generate_captions`` and
  ``CaptionModel.batch_beam_search`` with the official incremental key/value cache.
- ExpansionNet v2 (``jchenghu/ExpansionNet_v2``): ``ExpansionNet_v2(...)(enc_x=, enc_x_num_pads=, mode="beam_search",
  beam_size=K, beam_max_seq_len=steps + 1, ...)``, i.e. ``CaptioningModel.beam_search``: no cache, the whole prefix
  re-run every step.

Forced length, as for the edgecap columns: the end token given to the official code is an id the model cannot emit
(the vocabulary size for ACORT, -1 for ExpansionNet v2), so no hypothesis ends early and every decode runs the
protocol's steps (ACORT: ``max_seq_length = steps`` radix tokens; ExpansionNet v2: ``beam_max_seq_len = steps + 1``,
the start token counted). The official weights are the official random initialisation, not edgecap's: the column's
tokens are not compared with the others'.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ACORT = "acort"
EXPANSIONNET = "expansionnet"


@dataclass(frozen=True)
class OfficialCode:
    """One official repository: where it is, the commit the docs measured, the files a cell imports, and the decode
    function it times."""

    kind: str
    repo: str
    commit: str
    flag: str
    files: tuple[str, ...]
    function: str


OFFICIAL_CODE = {
    ACORT: OfficialCode(
        ACORT,
        "jiahuei/sparse-image-captioning",
        "0429b4f8a1e33263205ebfa76716ea6be6d5cdff",
        "--official-acort",
        (
            "sparse_caption/models/relation_transformer.py",
            "sparse_caption/models/transformer.py",
            "sparse_caption/models/caption_model.py",
            "sparse_caption/utils/model_utils.py",
            "sparse_caption/utils/misc.py",
        ),
        "RelationTransformerModel(...)(..., mode='sample') → CaptionModel.batch_beam_search, incremental cache",
    ),
    EXPANSIONNET: OfficialCode(
        EXPANSIONNET,
        "jchenghu/ExpansionNet_v2",
        "eb7f1c98d00cdaa61b60c43852155b3742fe5b45",
        "--official-expansionnet",
        ("models/ExpansionNet_v2.py", "models/captioning_model.py", "models/layers.py", "utils/masking.py"),
        "ExpansionNet_v2(...)(..., mode='beam_search') → CaptioningModel.beam_search, prefix re-run every step",
    ),
}

#: Families of edgecap model configs -> the official code that implements them.
FAMILY_KIND = {"ort": ACORT, "expansionnet": EXPANSIONNET}


def official_kind(model: str) -> str | None:
    """Which official code decodes ``model`` (an edgecap model name), or None."""
    from edgecap.models import get_model_cfg

    return FAMILY_KIND.get(get_model_cfg(model).family)


def check_checkout(kind: str, path: Path) -> None:
    """Raise ``ValueError`` naming what is missing when ``path`` is not a checkout of the official ``kind`` code."""
    code = OFFICIAL_CODE[kind]
    missing = [f for f in code.files if not (Path(path) / f).is_file()]
    if missing:
        raise ValueError(
            f"{code.flag} {path}: not a checkout of {code.repo} (missing {', '.join(missing)}); "
            f"clone it and check out {code.commit[:12]}"
        )


# -- importing the official model modules, and nothing else ------------------------------------------------------------
#: Top-level module names this helper registered, per checkout (so a later import of another checkout replaces them).
_LOADED: dict[str, str] = {}


def _forget(prefixes: tuple[str, ...]) -> None:
    for name in [n for n in sys.modules if n.split(".")[0] in prefixes]:
        if _LOADED.get(name.split(".")[0]) is None:
            raise RuntimeError(
                f"a module {name!r} not from an official checkout is imported; the official code needs that name"
            )
        del sys.modules[name]


def _package(name: str, directory: Path, **attrs: Any) -> types.ModuleType:
    """An empty package ``name`` whose submodules load from ``directory``: the official ``__init__`` (which imports
    every model, data and training module of the repository) does not run."""
    module = types.ModuleType(name)
    module.__path__ = [str(directory)]
    module.__dict__.update(attrs)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


class _DataPipelineOnly:
    """Stands for the official collate classes: a model class names one for its argument parser, decoding never
    uses it (the real module imports the tokenizer, torchvision and PIL)."""


def import_acort(checkout: Path) -> types.ModuleType:
    """``sparse_caption.models.relation_transformer`` of the checkout, with the model modules it imports
    (``transformer``, ``caption_model``, ``utils.model_utils``, ``utils.misc``) and nothing of the data pipeline."""
    root = Path(checkout) / "sparse_caption"
    _forget(("sparse_caption",))
    _package("sparse_caption", root)
    _package("sparse_caption.models", root / "models", register_model=lambda name: lambda cls: cls)
    _package("sparse_caption.utils", root / "utils")
    _package("sparse_caption.data", root / "data")
    collate = types.ModuleType("sparse_caption.data.collate")
    collate.ObjectRelationCollate = collate.UpDownCollate = _DataPipelineOnly
    sys.modules[collate.__name__] = collate
    _LOADED["sparse_caption"] = str(checkout)
    return importlib.import_module("sparse_caption.models.relation_transformer")


def import_expansionnet(checkout: Path) -> types.ModuleType:
    """``models.ExpansionNet_v2`` of the checkout (it imports ``models.layers``, ``models.captioning_model`` and
    ``utils.masking`` by these top-level names)."""
    root = Path(checkout)
    _forget(("models", "utils"))
    _package("models", root / "models")
    _package("utils", root / "utils")
    _LOADED["models"] = _LOADED["utils"] = str(checkout)
    return importlib.import_module("models.ExpansionNet_v2")


# -- building and decoding -----------------------------------------------------------------------------------------
def build(kind: str, checkout: Path, model: str, settings: Mapping[str, int], steps: int, seed: int) -> Any:
    """The official model for edgecap's ``model`` config at ``settings`` (vocabulary size, feature dim), randomly
    initialised by the official code under ``torch.manual_seed(seed)``, in eval mode."""
    import torch

    from edgecap.models import get_model_cfg

    cfg = get_model_cfg(model)
    torch.manual_seed(seed)
    if kind == ACORT:
        module = import_acort(checkout)
        layers = len(cfg.enc_layer_map)
        if len(cfg.dec_layer_map) != layers:
            raise ValueError(f"{model}: the official code takes one layer count for both sides")
        config = types.SimpleNamespace(
            d_model=cfg.d_model,
            dim_feedforward=cfg.d_ff,
            num_layers=layers,
            num_heads=cfg.heads,
            share_att_encoder=cfg.share_att,
            share_att_decoder=cfg.share_att,
            share_layer_encoder=tuple(cfg.enc_layer_map),
            share_layer_decoder=tuple(cfg.dec_layer_map),
            drop_prob_src=cfg.feature_dropout,
            max_seq_length=steps,
            att_feat_size=settings["feature_dim"],
            vocab_size=settings["vocab_size"],
            bos_token_id=settings["vocab_size"] - 2,
            eos_token_id=settings["vocab_size"],  # never emitted: every decode runs max_seq_length steps
            unk_token_id=None,
            pad_token_id=0,
            no_box_trigonometric_embedding=not cfg.geometry,
        )
        return module.RelationTransformerModel(config).eval()
    if kind == EXPANSIONNET:
        module = import_expansionnet(checkout)
        vocab = settings["vocab_size"]
        words = [f"w{i}" for i in range(vocab)]
        drops = types.SimpleNamespace(enc=0.0, dec=0.0, enc_input=0.0, dec_input=0.0, other=0.0)
        return module.ExpansionNet_v2(
            d_model=cfg.d_model,
            N_enc=cfg.enc_layers,
            N_dec=cfg.dec_layers,
            ff=cfg.d_ff,
            num_heads=cfg.heads,
            num_exp_enc_list=list(cfg.enc_groups),
            num_exp_dec=cfg.dec_slots,
            output_word2idx={w: i for i, w in enumerate(words)},
            output_idx2word=words,
            max_seq_len=cfg.max_len,
            drop_args=drops,
            img_feature_dim=settings["feature_dim"],
            rank="cpu",
        ).eval()
    raise ValueError(f"unknown official code {kind!r}")


def decoder(kind: str, model: Any, inputs: Mapping[str, Any], beam: int, steps: int) -> Callable[[], list[list[int]]]:
    """A call of the official decode function on ``inputs`` (edgecap's features, boxes, mask) at ``beam`` (1 =
    the official greedy path), returning each image's best tokens."""
    feats, boxes, mask = inputs["features"], inputs["boxes"], inputs["feature_mask"]
    if kind == ACORT:
        opt = {"beam_size": beam}

        def run() -> list[list[int]]:
            seq, _ = model(att_feats=feats, boxes=boxes, att_masks=mask.float(), opt=opt, mode="sample")
            return [row[0].tolist() for row in seq]

        return run
    if kind == EXPANSIONNET:
        kwargs = {
            "beam_size": beam,
            "beam_max_seq_len": steps + 1,
            "how_many_outputs": 1,
            "sample_or_max": "max",
            "sos_idx": 0,
            "eos_idx": -1,  # never emitted: every decode runs beam_max_seq_len - 1 words
        }
        pads = [0] * feats.shape[0]

        def run() -> list[list[int]]:
            pred, _ = model(enc_x=feats, enc_x_num_pads=pads, mode="beam_search", **kwargs)
            return [hyps[0][1:] for hyps in pred]

        return run
    raise ValueError(f"unknown official code {kind!r}")
