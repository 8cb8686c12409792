"""Import official Object Relation Transformer checkpoints (yahoo/object_relation_transformer).

The checkpoint (``model-best.pth``) is the model's ``state_dict`` in the layout of
:mod:`edgecap.workshop.interop._relation_transformer` (no attention sharing, every layer its own). The vocabulary is
``ix_to_word`` (ids 1…V as strings), stored in the preprocessed ``cocotalk.json`` and in the run's
``infos_*.pkl`` (``infos["vocab"]``; that pickle also holds an ``argparse.Namespace``, so it needs
``--trust-pickle``). ORT's id 0 is both the start token fed to the decoder and the end token it emits; edgecap's
separate BOS and EOS both take row 0 (:mod:`edgecap.workshop.interop._vocab`), the word ``UNK`` becomes ``<unk>``.

Not supported (an error names the tensor): ``use_bn`` region embeddings (BatchNorm in ``att_embed``). The
``legacy_extra_skip`` option leaves no trace in the weights: checkpoints trained with it import but compute a
different function.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgecap.runtime.vocab import WordVocab
from edgecap.workshop.interop._families import check_feature_width, check_layout, looks_like_acort
from edgecap.workshop.interop._mapping import OfficialState, load_converted
from edgecap.workshop.interop._reading import CheckpointError, read_checkpoint, read_pickle, read_vocab_json
from edgecap.workshop.interop._relation_transformer import convert_relation_transformer, infer_relation_transformer
from edgecap.workshop.interop._run import ImportedRun, choose_registered, official_max_words
from edgecap.workshop.interop._vocab import NEVER_LOGIT, move_rows
from edgecap.workshop.models import create_model, get_model_cfg

__all__ = ["ORT_MAX_TOKENS", "ORT_MAX_WORDS", "import_ort", "read_ix_to_word"]

#: ORT's ``seq_length`` for COCO (the preprocessing's max_length 16): ``_sample`` and ``beam_search`` generate at most
#: 16 tokens, EOS counted among them (``for t in range(seq_length + 1)`` feeds BOS at ``t = 0`` and stops at
#: ``t == seq_length``), so an unfinished caption has 16 words.
ORT_MAX_TOKENS = 16
#: The run's ``max_words`` for it: 15 words + EOS = 16 tokens (:func:`official_max_words`).
ORT_MAX_WORDS = official_max_words(ORT_MAX_TOKENS, 1)
_UNK_WORDS = ("UNK", "<unk>")


def read_ix_to_word(path: str | Path, trust_pickle: bool = False) -> list[str]:
    """Words by ORT id (index 0 of the result is id 1) from ``cocotalk.json``, a bare ``{"1": word}`` JSON or an
    ``infos_*.pkl``.

    Raises:
        CheckpointError: unreadable file, no ``ix_to_word``, ids that are not exactly 1…V.
    """
    path = Path(path)
    if path.suffix == ".json":
        data: Any = read_vocab_json(path)
    else:
        if path.is_file() and path.read_bytes()[:6] == b"<pad>\t":
            raise CheckpointError(f"{path} is a SentencePiece vocabulary (ACORT's word.vocab? then pass --from acort)")
        data = read_pickle(path, trust_pickle)
        data = vars(data) if hasattr(data, "__dict__") and not isinstance(data, Mapping) else data
    if isinstance(data, Mapping):
        data = data.get("ix_to_word", data.get("vocab", data))
    if not isinstance(data, Mapping) or not data:
        raise CheckpointError(f"{path}: no ix_to_word mapping (expected cocotalk.json or an infos pickle)")
    try:
        ids = sorted(int(k) for k in data)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: ix_to_word keys must be integer ids") from exc
    if ids != list(range(1, len(ids) + 1)):
        raise CheckpointError(f"{path}: ix_to_word ids must run 1…{len(ids)}")
    lookup = {int(k): v for k, v in data.items()}
    return [str(lookup[i]) for i in ids]


def import_ort(
    checkpoint: str | Path, vocab: str | Path | None, trust_pickle: bool = False, feature_dim: int | None = None
) -> ImportedRun:
    """Read an official ORT checkpoint and its ``ix_to_word`` into a loaded ``ort-*-ref`` model.

    ``feature_dim`` confirms an input width no official backbone gives (features of your own); None: it must be the
    bottom-up features' 2,048.

    Raises:
        CheckpointError: see :func:`read_checkpoint`, :func:`read_ix_to_word`; or vocabulary and checkpoint sizes
            that disagree.
    """
    if vocab is None:
        raise CheckpointError(
            "ORT checkpoints do not hold their vocabulary: pass --vocab cocotalk.json (or infos_*.pkl)"
        )
    state = OfficialState(read_checkpoint(checkpoint, trust_pickle), str(checkpoint))
    check_layout(state.names(), "relation-transformer", str(checkpoint), "ORT")
    arch = infer_relation_transformer(state, "kv")
    acort = looks_like_acort(arch)
    if acort:
        raise CheckpointError(
            f"{checkpoint} looks like an ACORT checkpoint, not ORT's ({acort}; ORT shares neither): pass --from acort"
        )
    width = check_feature_width(
        arch["feature_dim"], "relation-transformer", "att_embed.0.weight", str(checkpoint), feature_dim
    )
    official_words = read_ix_to_word(vocab, trust_pickle)
    if len(official_words) + 1 != arch["vocab_size"]:
        raise CheckpointError(
            f"{vocab} has {len(official_words)} words but {checkpoint} has {arch['vocab_size']} output classes "
            "(words + 1): they do not belong together"
            + (
                f" ({arch['vocab_size']} - 3 = {arch['vocab_size'] - 3} would be an ACORT radix base: --from acort?)"
                if arch["vocab_size"] - 3 < len(official_words)
                else ""
            )
        )
    fields = {k: arch[k] for k in ("d_model", "d_ff", "heads", "geometry_dim", "share_att")}
    cfg = get_model_cfg("ort-base-ref").replace(
        **fields, enc_layer_map=arch["enc_layer_map"], dec_layer_map=arch["dec_layer_map"]
    )
    name, overrides = choose_registered(cfg, "ort-base-ref")
    converted = convert_relation_transformer(state, arch, cfg.max_len)
    state.finish()

    unk = next((i + 1 for i, w in enumerate(official_words) if w in _UNK_WORDS), None)
    words = [w for i, w in enumerate(official_words) if i + 1 != unk]
    word_vocab = WordVocab(words)
    # edgecap ids PAD, BOS, EOS, UNK, words… <- ORT ids 0 (start/end), 0, 0, UNK's id, the other words in order.
    inputs: list[int | None] = [0, 0, 0, unk if unk is not None else 0]
    outputs: list[int | None] = [None, None, 0, unk]
    rest = [i + 1 for i in range(len(official_words)) if i + 1 != unk]
    inputs += rest
    outputs += rest
    converted["embed.embed.weight"] = move_rows(converted["embed.embed.weight"], inputs)
    converted["output_proj.weight"] = move_rows(converted["output_proj.weight"], outputs)
    converted["output_proj.bias"] = move_rows(converted["output_proj.bias"], outputs, fill=NEVER_LOGIT)

    model = create_model(name, vocab_size=word_vocab.size, feature_dim=arch["feature_dim"], **overrides)
    load_converted(model, converted, str(checkpoint))
    notes = [
        width,
        f"{len(official_words)} ORT words; id 0 -> <bos> and <eos>; "
        + (f"word {official_words[unk - 1]!r} -> <unk>" if unk else "no UNK word: <unk> is never emitted"),
        f"decoding cap: the official seq_length {ORT_MAX_TOKENS} tokens, EOS included -> max_words {ORT_MAX_WORDS}",
    ]
    return ImportedRun(model, name, overrides, arch["feature_dim"], word_vocab, ORT_MAX_WORDS, "ort", notes)
