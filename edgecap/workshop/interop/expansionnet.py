"""Import official ExpansionNet v2 checkpoints (jchenghu/ExpansionNet_v2), end-to-end or features-only.

Official names (``{i}`` a layer) -> edgecap:

=====================================================================  ===============================================
official                                                               edgecap
=====================================================================  ===============================================
``input_linear.*``                                                     ``feature_embed.0.*``
``encoders.{i}.norm_{1,2}.*``                                          ``encoder.{i}.norm{1,2}.*``
``encoders.{i}.stc_exp.{query,bias}_exp_vectors.weight``               ``encoder.{i}.expansion.{query,bias}``
``encoders.{i}.stc_exp.{key_embed,class_a_embed,class_b_embed,``       ``encoder.{i}.expansion.in_proj`` (stacked in
``selector_embed}.*``                                                  this order: K, V1, V2, S)
``encoders.{i}.ff.linear_{1,2}.*``                                     ``encoder.{i}.ffn.fc{1,2}.*``
``enc_reduce_group.*``, ``enc_reduce_norm.*``                          ``encoder_reduce.{proj,norm}.*``
``decoders.{i}.dyn_exp.{cond_embed,key_linear,class_a_embed,``         ``decoder.{i}.expansion.in_proj`` (C, K, V1,
``class_b_embed,selector_embed}.*``                                    V2, S)
``decoders.{i}.mha.{Wq,Wk,Wv,out_linear}.*``                           ``decoder.{i}.cross_attn.{q,k,v,out}_proj.*``
``decoders.{i}.norm_{1,2,3}``, ``decoders.{i}.ff.*``                   ``decoder.{i}.norm{1,2,3}``, ``…ffn.*``
``dec_reduce_group.*``, ``dec_reduce_norm.*``                          ``decoder_reduce.{proj,norm}.*``
``out_embedder.embed.weight``                                          ``embed.embed.weight``
``pos_encoder.weight``                                                 ``embed.positions.weight``
``vocab_linear.*``                                                     ``output_proj.*``
``swin_transf.*``                                                      ``RUN/backbone.safetensors`` (timm Swin-L)
=====================================================================  ===============================================

The vocabulary (``demo_coco_tokens.pickle``: ``idx2word_list``, ``word2idx_dict``, ``sos_str``, ``eos_str``) sorts
its specials among the words; rows are moved so that PAD, SOS, EOS, UNK take edgecap's ids 0-3 and the words keep
their official order. Preprocessing is the official one (v2 §4.2 and its data loader): resize to 384×384 without
keeping the aspect ratio (bilinear), ImageNet mean/std; it is recorded in the run's backbone spec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from edgecap.runtime.vocab import WordVocab
from edgecap.workshop.interop._families import check_feature_width, check_layout
from edgecap.workshop.interop._mapping import OfficialState, layer_positions, load_converted
from edgecap.workshop.interop._reading import CheckpointError, read_checkpoint, read_pickle, read_vocab_json
from edgecap.workshop.interop._run import BackboneFile, ImportedRun, choose_registered, official_max_words
from edgecap.workshop.interop._swin import official_swin_to_timm, timm_feature_shapes
from edgecap.workshop.interop._vocab import move_rows
from edgecap.workshop.models import create_model, get_model_cfg
from edgecap.workshop.models._expansionnet_cfg import V2_GROUPS

__all__ = [
    "EXPANSIONNET_MAX_TOKENS",
    "EXPANSIONNET_MAX_WORDS",
    "OFFICIAL_PREPROCESS",
    "SWIN_BACKBONE",
    "import_expansionnet_v2",
    "read_expansionnet_vocab",
]

#: The official backbone: Swin-L, patch 4, window 12, 384 px (v2 §4.2).
SWIN_BACKBONE = "swin_large_patch4_window12_384"
#: ``Resize((384, 384))`` (bilinear, aspect ratio not kept), ``ToTensor``, ImageNet mean/std: as a
#: :class:`~edgecap.runtime.images.preprocess.PreprocessCfg` ("squash" to exactly the input size, no crop).
OFFICIAL_PREPROCESS: dict[str, Any] = {
    "image_size": 384,
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "interpolation": "bilinear",
    "crop_pct": 1.0,
    "crop_mode": "squash",
}
#: The official ``beam_search`` default ``beam_max_seq_len=20`` counts the SOS it starts from (the sequence grows
#: from ``[SOS, w1]`` while ``time_step < 20``): at most 19 generated tokens, EOS counted among them.
EXPANSIONNET_MAX_TOKENS = 19
#: The run's ``max_words`` for it: 18 words + EOS = 19 tokens (:func:`official_max_words`).
EXPANSIONNET_MAX_WORDS = official_max_words(EXPANSIONNET_MAX_TOKENS, 1)
_SPECIAL_KEYS = (("pad_str", "PAD"), ("sos_str", "SOS"), ("eos_str", "EOS"), ("unk_str", "UNK"))
_STATIC_PARTS = ("key_embed", "class_a_embed", "class_b_embed", "selector_embed")
_DYNAMIC_PARTS = ("cond_embed", "key_linear", "class_a_embed", "class_b_embed", "selector_embed")
_MHA = (("Wq", "q_proj"), ("Wk", "k_proj"), ("Wv", "v_proj"), ("out_linear", "out_proj"))


def read_expansionnet_vocab(path: str | Path, trust_pickle: bool = False) -> tuple[list[str], tuple[int, ...]]:
    """Official words by index and the indices of PAD, SOS, EOS, UNK, from the tokens pickle (or a JSON of it).

    Raises:
        CheckpointError: unreadable file, no ``idx2word_list``, a missing special, inconsistent ``word2idx_dict``.
    """
    path = Path(path)
    if path.suffix == ".json":
        data: Any = read_vocab_json(path)
    else:
        data = read_pickle(path, trust_pickle)
    if not isinstance(data, Mapping) or not isinstance(data.get("idx2word_list"), Sequence):
        raise CheckpointError(f"{path}: expected a dict with 'idx2word_list' (ExpansionNet's tokens pickle)")
    words = [str(w) for w in data["idx2word_list"]]
    word2idx = data.get("word2idx_dict")
    if isinstance(word2idx, Mapping):
        try:
            pairs = [(w, int(i)) for w, i in word2idx.items()]
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{path}: word2idx_dict values must be integer indices") from exc
        if any(words[i] != w for w, i in pairs if 0 <= i < len(words)):
            raise CheckpointError(f"{path}: word2idx_dict and idx2word_list disagree")
    specials = []
    for key, default in _SPECIAL_KEYS:
        token = str(data.get(key, default))
        if token not in words:
            raise CheckpointError(f"{path}: the special token {token!r} ({key}) is not in idx2word_list")
        specials.append(words.index(token))
    return words, tuple(specials)


def _stacked(state: OfficialState, prefix: str, parts: Sequence[str], d: int) -> dict[str, torch.Tensor]:
    """Separate ``Linear(d, d)`` maps -> the fused ``in_proj`` of edgecap's expansion layers (rows in ``parts``
    order)."""
    weight = torch.cat([state.take(f"{prefix}.{p}.weight", (d, d)) for p in parts], dim=0)
    bias = torch.cat([state.take(f"{prefix}.{p}.bias", (d,)) for p in parts], dim=0)
    return {"in_proj.weight": weight, "in_proj.bias": bias}


def _copy(
    state: OfficialState, pairs: Sequence[tuple[str, str]], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    """Take ``official.{weight,bias}`` as ``ours.{weight,bias}``, each checked against the model's shape under the
    official name (a flattened or transposed tensor is named as the checkpoint spells it)."""
    out = {}
    for official, ours in pairs:
        for suffix in ("weight", "bias"):
            out[f"{ours}.{suffix}"] = state.take(f"{official}.{suffix}", shapes[f"{ours}.{suffix}"])
    return out


def _convert(
    state: OfficialState, enc: int, dec: int, d: int, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    """Official tensors -> edgecap names; ``shapes`` are the model's (vocabulary rows in the official order, the same
    count)."""

    def copy(pairs: Sequence[tuple[str, str]]) -> dict[str, torch.Tensor]:
        return _copy(state, pairs, shapes)

    out = copy([("input_linear", "feature_embed.0")])
    for i in range(enc):
        src, dst = f"encoders.{i}", f"encoder.{i}"
        out.update(copy([(f"{src}.norm_1", f"{dst}.norm1"), (f"{src}.norm_2", f"{dst}.norm2")]))
        out.update(copy([(f"{src}.ff.linear_1", f"{dst}.ffn.fc1"), (f"{src}.ff.linear_2", f"{dst}.ffn.fc2")]))
        out[f"{dst}.expansion.query"] = state.take(
            f"{src}.stc_exp.query_exp_vectors.weight", shapes[f"{dst}.expansion.query"]
        )
        out[f"{dst}.expansion.bias"] = state.take(
            f"{src}.stc_exp.bias_exp_vectors.weight", shapes[f"{dst}.expansion.bias"]
        )
        out.update({f"{dst}.expansion.{k}": v for k, v in _stacked(state, f"{src}.stc_exp", _STATIC_PARTS, d).items()})
    for i in range(dec):
        src, dst = f"decoders.{i}", f"decoder.{i}"
        norms = [(f"{src}.norm_{n}", f"{dst}.norm{n}") for n in (1, 2, 3)]
        ffn = [(f"{src}.ff.linear_1", f"{dst}.ffn.fc1"), (f"{src}.ff.linear_2", f"{dst}.ffn.fc2")]
        mha = [(f"{src}.mha.{a}", f"{dst}.cross_attn.{b}") for a, b in _MHA]
        out.update(copy([*norms, *ffn, *mha]))
        out[f"{dst}.expansion.query"] = state.take(
            f"{src}.dyn_exp.query_exp_vectors.weight", shapes[f"{dst}.expansion.query"]
        )
        out[f"{dst}.expansion.bias"] = state.take(
            f"{src}.dyn_exp.bias_exp_vectors.weight", shapes[f"{dst}.expansion.bias"]
        )
        out.update({f"{dst}.expansion.{k}": v for k, v in _stacked(state, f"{src}.dyn_exp", _DYNAMIC_PARTS, d).items()})
    out.update(
        copy(
            [
                ("enc_reduce_group", "encoder_reduce.proj"),
                ("enc_reduce_norm", "encoder_reduce.norm"),
                ("dec_reduce_group", "decoder_reduce.proj"),
                ("dec_reduce_norm", "decoder_reduce.norm"),
                ("vocab_linear", "output_proj"),
            ],
        )
    )
    out["embed.embed.weight"] = state.take("out_embedder.embed.weight", shapes["embed.embed.weight"])
    out["embed.positions.weight"] = state.take("pos_encoder.weight", shapes["embed.positions.weight"])
    return out


def _groups(total: int, enc_groups: Sequence[int] | None, source: str) -> tuple[int, ...]:
    if enc_groups is not None:
        groups = tuple(int(g) for g in enc_groups)
        if sum(groups) != total:
            raise CheckpointError(
                f"{source}: enc_groups {list(groups)} sum to {sum(groups)}, the checkpoint has {total}"
            )
        return groups
    if total == sum(V2_GROUPS):
        return V2_GROUPS
    raise CheckpointError(
        f"{source}: {total} static expansion vectors per layer; the group lengths cannot be read from the weights, "
        "pass --enc-groups (e.g. 32,64,128,256,512)"
    )


def import_expansionnet_v2(
    checkpoint: str | Path,
    vocab: str | Path | None,
    trust_pickle: bool = False,
    heads: int = 8,
    enc_groups: Sequence[int] | None = None,
    backbone: str = SWIN_BACKBONE,
    image_size: int = 384,
    feature_dim: int | None = None,
) -> ImportedRun:
    """Read an official ExpansionNet v2 checkpoint (``rf_model.pth``) and its tokens pickle.

    Args:
        checkpoint: the training checkpoint (``model_state_dict`` inside) or a bare state dict.
        vocab: ``demo_coco_tokens.pickle`` or a dump of the training vocabulary in the same format.
        trust_pickle: allow unpickling Python objects (the training checkpoint's loader state may need it).
        heads: cross-attention heads (not visible in the weights; the official code uses 8).
        enc_groups: Block Static Expansion lengths; default v2's ``32, 64, 128, 256, 512`` when they fit.
        backbone: the timm name of the Swin in an end-to-end checkpoint.
        image_size: its input size (384 for the official Swin-L); preprocessing resizes to it.
        feature_dim: confirms an input width no official backbone gives (features of your own); None: a
            features-only checkpoint must take Swin-L's 1,536 channels, an end-to-end one its own Swin's.
    """
    if vocab is None:
        raise CheckpointError(
            "ExpansionNet v2 checkpoints do not hold their vocabulary: pass --vocab demo_coco_tokens.pickle"
        )
    source = str(checkpoint)
    state = OfficialState(read_checkpoint(checkpoint, trust_pickle), source)
    check_layout(state.names(), "expansionnet-v2", source, "ExpansionNet v2")
    swin = state.take_prefix("swin_transf.")
    weight = state.peek("input_linear.weight", ndim=2)
    d, width = int(weight.shape[0]), int(weight.shape[1])
    if swin:  # end to end: the Swin in the checkpoint gives the features (checked against timm's below)
        if feature_dim is not None and feature_dim != width:
            raise CheckpointError(f"{source}: --feature-dim {feature_dim}, but 'input_linear.weight' takes {width}-d")
        width_note = f"input width {width}: the checkpoint's Swin"
    else:
        width_note = check_feature_width(width, "expansionnet-v2", "input_linear.weight", source, feature_dim)
    feature_dim = width
    enc, dec = layer_positions(state, "encoders."), layer_positions(state, "decoders.")
    groups = _groups(
        int(state.peek("encoders.0.stc_exp.query_exp_vectors.weight", ndim=2).shape[0]), enc_groups, source
    )
    cfg = get_model_cfg("expansionnet-v2-ref").replace(
        d_model=d,
        d_ff=int(state.peek("encoders.0.ff.linear_1.weight", ndim=2).shape[0]),
        heads=heads,
        enc_layers=enc,
        dec_layers=dec,
        enc_groups=groups,
        dec_slots=int(state.peek("decoders.0.dyn_exp.query_exp_vectors.weight", ndim=2).shape[0]),
        max_len=int(state.peek("pos_encoder.weight", ndim=2).shape[0]),
        feature_dim=feature_dim,
    )
    name, overrides = choose_registered(cfg, "expansionnet-v2-ref")
    classes = int(state.peek("vocab_linear.weight", ndim=2).shape[0])
    model = create_model(name, vocab_size=classes, feature_dim=feature_dim, **overrides)
    converted = _convert(state, enc, dec, d, {k: tuple(v.shape) for k, v in model.state_dict().items()})
    state.finish()

    words, specials = read_expansionnet_vocab(vocab, trust_pickle)
    if len(words) != classes:
        raise CheckpointError(f"{vocab} has {len(words)} tokens but {checkpoint} has {classes} output classes")
    order = [*specials, *(i for i in range(len(words)) if i not in specials)]
    word_vocab = WordVocab([words[i] for i in order[4:]])
    for key in ("embed.embed.weight", "output_proj.weight", "output_proj.bias"):
        converted[key] = move_rows(converted[key], order)
    load_converted(model, converted, source)

    notes = [
        width_note,
        f"official specials at {dict(zip(('PAD', 'SOS', 'EOS', 'UNK'), specials, strict=True))} -> 0-3",
        f"decoding cap: beam_max_seq_len 20 = SOS + {EXPANSIONNET_MAX_TOKENS} tokens, EOS included -> max_words "
        f"{EXPANSIONNET_MAX_WORDS}",
    ]
    backbone_file = None
    if swin:
        backbone_file = _backbone(swin, backbone, image_size, feature_dim, source)
        notes.append(f"Swin weights -> timm {backbone}, preprocessing {backbone_file.spec}")
    else:
        notes.append("features-only checkpoint: no backbone in the run")
    return ImportedRun(
        model, name, overrides, feature_dim, word_vocab, EXPANSIONNET_MAX_WORDS, "expansionnet-v2", notes, backbone_file
    )


def _backbone(swin: Mapping[str, torch.Tensor], name: str, size: int, feature_dim: int, source: str) -> BackboneFile:
    shapes, width = timm_feature_shapes(name, size)
    if width != feature_dim:
        raise CheckpointError(f"{source}: timm {name} gives {width}-d features, the captioner takes {feature_dim}")
    state = official_swin_to_timm(swin, shapes, f"{source} (swin_transf)")
    grid = size // 32  # Swin: patch 4, then three 2× patch mergings
    spec = {"name": name, **OFFICIAL_PREPROCESS, "image_size": size, "feature_dim": width, "grid": [grid, grid]}
    return BackboneFile(state=state, spec=spec)
