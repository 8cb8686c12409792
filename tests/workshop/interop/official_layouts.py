"""The official state-dict layouts of ORT, ACORT, ExpansionNet v2 and Microsoft's Swin, written from reading their
module definitions (no code copied), and the fixtures generated from them.

Each layout function returns ``{"tensors": {official name: shape}, "aliases": {name: name it repeats},
"dest": {official name: [edgecap name, first row, last row + 1] or null}}``:

- ``tensors``: what the official ``state_dict()`` holds, buffers included;
- ``aliases``: ACORT's layer sharing lists one module at several positions of a ``ModuleList``; ``state_dict()``
  then repeats its tensors under every position (the importer must collapse them onto one unique layer);
- ``dest``: where each tensor must land in edgecap's model, as a row slice of an edgecap tensor (a per-head
  ``Linear(64, 1)`` of ORT is one row of edgecap's ``Linear(64, H)``; the five ``Linear(d, d)`` of a Dynamic
  Expansion are row blocks of one fused ``Linear(d, 5d)``). ``null``: aliases and derived buffers, stored nowhere.
  Vocabulary rows (embedding, output projection) are listed in official id order; tests apply the vocabulary's
  id map on top.

Sources read: ``yahoo/object_relation_transformer`` ``models/RelationTransformerModel.py`` (ORT);
``jiahuei/sparse-image-captioning`` ``sparse_caption/models/{transformer,relation_transformer}.py`` (ACORT);
``jchenghu/ExpansionNet_v2`` ``models/{layers,End_ExpansionNet_v2}.py``; Microsoft's ``swin_transformer.py`` as
kept in ExpansionNet v2's ``models/swin_transformer_mod.py`` (head and pooling removed, ``ape=False``,
``patch_norm=True``).

Run ``python -m tests.workshop.interop.official_layouts`` from the repository root to rewrite
``tests/workshop/interop/fixtures/``
(``test_fixtures_are_current`` fails when they drift from this file). The timm key list of Swin-L is recorded too,
from ``timm.create_model(..., pretrained=False)`` on the meta device, so tests do not build the 197 M-parameter
model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"

#: Small configurations for the fixtures: every mechanism at toy size, on the official backbones' feature widths (the
#: importers refuse others unless told: 2048 bottom-up regions for ORT/ACORT, 1536 Swin-L for ExpansionNet v2).
ACORT_SHARED = {
    "d": 32, "d_ff": 64, "heads": 2, "feature_dim": 2048, "vocab": 771,
    "enc_map": [0, 0, 1], "dec_map": [0, 1, 1], "share": "kv", "pe_len": 80,
}  # fmt: skip
ORT_TINY = {
    "d": 32, "d_ff": 64, "heads": 2, "feature_dim": 2048, "vocab": 13,
    "enc_map": [0, 1], "dec_map": [0, 1], "share": None, "pe_len": 80,
}  # fmt: skip
EXPANSIONNET_TINY = {
    "d": 32, "d_ff": 64, "enc": 2, "dec": 2, "groups": [3, 5], "slots": 2, "vocab": 14, "max_len": 12,
    "feature_dim": 1536,
}  # fmt: skip
#: Swin-L of ExpansionNet v2 (End_ExpansionNet_v2 in train.py/demo.py): patch 4, embed 192, depths 2-2-18-2,
#: heads 6-12-24-48, window 12, 384 px.
SWIN_LARGE = {"embed": 192, "depths": [2, 2, 18, 2], "heads": [6, 12, 24, 48], "window": 12, "image": 384}
SWIN_TINY = {"embed": 96, "depths": [2, 2, 6, 2], "heads": [3, 6, 12, 24], "window": 7, "image": 224}

_PROJ = {None: ["q_proj", "k_proj", "v_proj", "out_proj"], "kv": ["q_proj", "k_proj", "out_proj"],
         "qk": ["q_proj", "v_proj", "out_proj"]}  # fmt: skip


class _Layout:
    def __init__(self) -> None:
        self.tensors: dict[str, list[int]] = {}
        self.aliases: dict[str, str] = {}
        self.dest: dict[str, Any] = {}

    def add(self, name: str, shape: list[int], dest: str | None, rows: tuple[int, int] | None = None) -> None:
        self.tensors[name] = list(shape)
        if dest is None:
            self.dest[name] = None
        else:
            start, stop = rows if rows is not None else (0, shape[0])
            self.dest[name] = [dest, start, stop]

    def linear(self, name: str, out_f: int, in_f: int, dest: str | None, rows: tuple[int, int] | None = None) -> None:
        self.add(f"{name}.weight", [out_f, in_f], dest and f"{dest}.weight", rows)
        self.add(f"{name}.bias", [out_f], dest and f"{dest}.bias", rows)

    def alias(self, name: str, shape: list[int], of: str) -> None:
        self.tensors[name] = list(shape)
        self.aliases[name] = of
        self.dest[name] = None

    def as_dict(self) -> dict[str, Any]:
        return {"tensors": self.tensors, "aliases": self.aliases, "dest": self.dest}


def relation_transformer(cfg: dict[str, Any]) -> dict[str, Any]:
    """ORT (``share None``, every position its own layer) or ACORT (Share-KV, layer maps with repeats)."""
    d, d_ff, heads, share = cfg["d"], cfg["d_ff"], cfg["heads"], cfg["share"]
    lay = _Layout()
    lay.linear("att_embed.0", d, cfg["feature_dim"], "feature_embed.0")

    def layer(prefix: str, dest: str | None, decoder: bool) -> None:
        attns = [("self_attn", "self_attn"), ("src_attn", "cross_attn")] if decoder else [("self_attn", "attn")]
        for official, ours in attns:
            for j, proj in enumerate(_PROJ[share]):
                lay.linear(f"{prefix}.{official}.linears.{j}", d, d, dest and f"{dest}.{ours}.{proj}")
        if not decoder:
            for h in range(heads):
                g = dest and f"{dest}.geometric_bias.proj"
                lay.add(f"{prefix}.self_attn.WGs.{h}.weight", [1, 64], g and f"{g}.weight", (h, h + 1))
                lay.add(f"{prefix}.self_attn.WGs.{h}.bias", [1], g and f"{g}.bias", (h, h + 1))
        lay.linear(f"{prefix}.feed_forward.w_1", d_ff, d, dest and f"{dest}.ffn.fc1")
        lay.linear(f"{prefix}.feed_forward.w_2", d, d_ff, dest and f"{dest}.ffn.fc2")
        for s in range(3 if decoder else 2):
            norm = dest and f"{dest}.norm{s + 1}"
            lay.add(f"{prefix}.sublayer.{s}.norm.a_2", [d], norm and f"{norm}.weight")
            lay.add(f"{prefix}.sublayer.{s}.norm.b_2", [d], norm and f"{norm}.bias")

    for side, layer_map, decoder in (("encoder", cfg["enc_map"], False), ("decoder", cfg["dec_map"], True)):
        first: dict[int, int] = {}
        for i, u in enumerate(layer_map):
            prefix = f"model.{side}.layers.{i}"
            if u in first:  # the same module object again: its tensors repeat under this position's names
                before = set(lay.tensors)
                layer(prefix, None, decoder)
                for name in set(lay.tensors) - before:
                    lay.alias(name, lay.tensors[name], name.replace(f"layers.{i}.", f"layers.{first[u]}.", 1))
            else:
                first[u] = i
                layer(prefix, f"{side}.layers.unique.{u}", decoder)
        lay.add(f"model.{side}.norm.a_2", [d], f"{side}.norm.weight")
        lay.add(f"model.{side}.norm.b_2", [d], f"{side}.norm.bias")
    lay.add("model.tgt_embed.0.lut.weight", [cfg["vocab"], d], "embed.embed.weight")
    lay.add("model.tgt_embed.1.pe", [1, cfg["pe_len"], d], None)  # PositionalEncoding's sinusoidal buffer
    lay.linear("model.generator.proj", cfg["vocab"], d, "output_proj")
    return lay.as_dict()


def expansionnet(cfg: dict[str, Any], swin: dict[str, Any] | None = None) -> dict[str, Any]:
    """End_ExpansionNet_v2 (with ``swin``) or the features-only ExpansionNet_v2."""
    d, d_ff, vocab = cfg["d"], cfg["d_ff"], cfg["vocab"]
    lay = _Layout()
    if swin is not None:
        for name, shape in microsoft_swin(swin).items():
            lay.add(f"swin_transf.{name}", shape, None)  # stored in backbone.safetensors, checked separately
    slots = sum(cfg["groups"])
    for i in range(cfg["enc"]):
        src, dst = f"encoders.{i}", f"encoder.{i}"
        for n in (1, 2):
            lay.add(f"{src}.norm_{n}.weight", [d], f"{dst}.norm{n}.weight")
            lay.add(f"{src}.norm_{n}.bias", [d], f"{dst}.norm{n}.bias")
        lay.add(f"{src}.stc_exp.query_exp_vectors.weight", [slots, d], f"{dst}.expansion.query")
        lay.add(f"{src}.stc_exp.bias_exp_vectors.weight", [slots, d], f"{dst}.expansion.bias")
        for p, part in enumerate(("key_embed", "class_a_embed", "class_b_embed", "selector_embed")):
            lay.linear(f"{src}.stc_exp.{part}", d, d, f"{dst}.expansion.in_proj", (p * d, (p + 1) * d))
        lay.linear(f"{src}.ff.linear_1", d_ff, d, f"{dst}.ffn.fc1")
        lay.linear(f"{src}.ff.linear_2", d, d_ff, f"{dst}.ffn.fc2")
    for i in range(cfg["dec"]):
        src, dst = f"decoders.{i}", f"decoder.{i}"
        for n in (1, 2, 3):
            lay.add(f"{src}.norm_{n}.weight", [d], f"{dst}.norm{n}.weight")
            lay.add(f"{src}.norm_{n}.bias", [d], f"{dst}.norm{n}.bias")
        for official, ours in (("Wq", "q_proj"), ("Wk", "k_proj"), ("Wv", "v_proj"), ("out_linear", "out_proj")):
            lay.linear(f"{src}.mha.{official}", d, d, f"{dst}.cross_attn.{ours}")
        lay.linear(f"{src}.dyn_exp.cond_embed", d, d, f"{dst}.expansion.in_proj", (0, d))
        lay.add(f"{src}.dyn_exp.query_exp_vectors.weight", [cfg["slots"], d], f"{dst}.expansion.query")
        lay.add(f"{src}.dyn_exp.bias_exp_vectors.weight", [cfg["slots"], d], f"{dst}.expansion.bias")
        for p, part in enumerate(("key_linear", "class_a_embed", "class_b_embed", "selector_embed"), start=1):
            lay.linear(f"{src}.dyn_exp.{part}", d, d, f"{dst}.expansion.in_proj", (p * d, (p + 1) * d))
        lay.linear(f"{src}.ff.linear_1", d_ff, d, f"{dst}.ffn.fc1")
        lay.linear(f"{src}.ff.linear_2", d, d_ff, f"{dst}.ffn.fc2")
    lay.linear("input_linear", d, cfg["feature_dim"], "feature_embed.0")
    lay.linear("vocab_linear", vocab, d, "output_proj")
    lay.add("out_embedder.embed.weight", [vocab, d], "embed.embed.weight")
    lay.add("pos_encoder.weight", [cfg["max_len"], d], "embed.positions.weight")
    lay.linear("enc_reduce_group", d, d * cfg["enc"], "encoder_reduce.proj")
    lay.add("enc_reduce_norm.weight", [d], "encoder_reduce.norm.weight")
    lay.add("enc_reduce_norm.bias", [d], "encoder_reduce.norm.bias")
    lay.linear("dec_reduce_group", d, d * cfg["dec"], "decoder_reduce.proj")
    lay.add("dec_reduce_norm.weight", [d], "decoder_reduce.norm.weight")
    lay.add("dec_reduce_norm.bias", [d], "decoder_reduce.norm.bias")
    return lay.as_dict()


def microsoft_swin(cfg: dict[str, Any]) -> dict[str, list[int]]:
    """Microsoft's SwinTransformer state dict (patch 4, patch_norm, no absolute positions, head removed).

    A block's window shrinks to the stage resolution when that is not larger than the window, and then does not
    shift; shifted blocks (odd index) save their ``attn_mask`` (windows, w², w²). Every block saves its
    ``relative_position_index`` (w², w²). Patch merging (``downsample``) ends every stage but the last.
    """
    out: dict[str, list[int]] = {}
    c = cfg["embed"]
    out["patch_embed.proj.weight"] = [c, 3, 4, 4]
    out["patch_embed.proj.bias"] = [c]
    out["patch_embed.norm.weight"] = [c]
    out["patch_embed.norm.bias"] = [c]
    stages = len(cfg["depths"])
    for i, (depth, heads) in enumerate(zip(cfg["depths"], cfg["heads"], strict=True)):
        dim, res = c * 2**i, cfg["image"] // 4 // 2**i
        window = min(cfg["window"], res)
        for j in range(depth):
            p = f"layers.{i}.blocks.{j}"
            out[f"{p}.norm1.weight"] = out[f"{p}.norm1.bias"] = [dim]
            out[f"{p}.attn.relative_position_bias_table"] = [(2 * window - 1) ** 2, heads]
            out[f"{p}.attn.relative_position_index"] = [window * window, window * window]
            out[f"{p}.attn.qkv.weight"] = [3 * dim, dim]
            out[f"{p}.attn.qkv.bias"] = [3 * dim]
            out[f"{p}.attn.proj.weight"] = [dim, dim]
            out[f"{p}.attn.proj.bias"] = [dim]
            out[f"{p}.norm2.weight"] = out[f"{p}.norm2.bias"] = [dim]
            out[f"{p}.mlp.fc1.weight"] = [4 * dim, dim]
            out[f"{p}.mlp.fc1.bias"] = [4 * dim]
            out[f"{p}.mlp.fc2.weight"] = [dim, 4 * dim]
            out[f"{p}.mlp.fc2.bias"] = [dim]
            if j % 2 == 1 and res > cfg["window"]:
                out[f"{p}.attn_mask"] = [(res // window) ** 2, window * window, window * window]
        if i < stages - 1:
            out[f"layers.{i}.downsample.reduction.weight"] = [2 * dim, 4 * dim]
            out[f"layers.{i}.downsample.norm.weight"] = out[f"layers.{i}.downsample.norm.bias"] = [4 * dim]
    final = c * 2 ** (stages - 1)
    out["norm.weight"] = out["norm.bias"] = [final]
    return out


def timm_swin_shapes(name: str, image_size: int) -> dict[str, list[int]]:
    """timm's headless key names and shapes (built on the meta device: no memory)."""
    import timm
    import torch

    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, num_classes=0, img_size=image_size)
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def fixtures() -> dict[str, Any]:
    """Everything written to ``fixtures/`` (the timm list only by :func:`main`, which needs timm)."""
    return {
        "acort_shared.json": {"config": ACORT_SHARED, **relation_transformer(ACORT_SHARED)},
        "ort_tiny.json": {"config": ORT_TINY, **relation_transformer(ORT_TINY)},
        "expansionnet_tiny.json": {"config": EXPANSIONNET_TINY, **expansionnet(EXPANSIONNET_TINY)},
        "swin_large_official.json": {"config": SWIN_LARGE, "tensors": microsoft_swin(SWIN_LARGE)},
    }


def main() -> None:
    FIXTURES.mkdir(exist_ok=True)
    files = fixtures()
    files["swin_large_timm.json"] = {
        "name": "swin_large_patch4_window12_384",
        "tensors": timm_swin_shapes("swin_large_patch4_window12_384", 384),
    }
    for name, content in files.items():
        (FIXTURES / name).write_text(json.dumps(content, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {FIXTURES / name}")


if __name__ == "__main__":
    main()
