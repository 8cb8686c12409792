"""Import official ACORT checkpoints (jiahuei/sparse-image-captioning, ``relation_transformer`` with radix tokens).

The checkpoint is the model's ``state_dict`` (layout: :mod:`edgecap.workshop.interop._relation_transformer`); the
vocabulary
is the SentencePiece ``word.vocab`` of the run's ``tokenizer/`` folder. Its radix layout (PAD 0, digits 1…v, BOS
v+1, EOS v+2, most-significant digit first, ``<unk>`` the last word index) is edgecap's :class:`RadixVocab`, so token
ids carry over unchanged; only the word list is read: SentencePiece ids 0-3 are ``<pad> <unk> <bos> <eos>`` and
word id ``w`` has radix index ``w - 4``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgecap.runtime.vocab import RadixVocab
from edgecap.workshop.interop._families import check_feature_width, check_layout, looks_like_acort
from edgecap.workshop.interop._mapping import OfficialState, load_converted
from edgecap.workshop.interop._reading import CheckpointError, read_checkpoint, read_vocab_text
from edgecap.workshop.interop._relation_transformer import convert_relation_transformer, infer_relation_transformer
from edgecap.workshop.interop._run import ImportedRun, choose_registered, official_max_words
from edgecap.workshop.models import create_model, get_model_cfg

__all__ = ["ACORT_MAX_TOKENS", "SP_SPECIALS", "import_acort", "read_sentencepiece_words"]

#: SentencePiece ids 0-3 of the ACORT tokenizer (trained with pad_id=0, unk_id=1, bos_id=2, eos_id=3).
SP_SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")
#: SentencePiece marks the start of a word with U+2581; a word-level model puts it on every piece.
_WORD_START = "\u2581"
#: The released ACORT training commands set ``max_seq_length 26``; ``_sample`` and the beam
#: search generate at most that many tokens, EOS counted among them: 13 complete words at 2 digits per word.
ACORT_MAX_TOKENS = 26


def read_sentencepiece_words(path: str | Path) -> list[str]:
    """Words of a SentencePiece ``.vocab`` file (``piece<TAB>score`` per line, in id order), specials excluded.

    Raises:
        CheckpointError: the file is missing, its first four pieces are not ACORT's specials, or a word repeats.
    """
    path = Path(path)
    if path.suffix == ".model" and path.is_file():
        raise CheckpointError(f"{path} is a SentencePiece model; pass the .vocab file beside it")
    text = read_vocab_text(path)
    if text.lstrip().startswith(("{", "[")):
        raise CheckpointError(
            f"{path} is JSON, not a SentencePiece word.vocab (ORT's cocotalk.json? then pass --from ort)"
        )
    pieces = [line.split("\t")[0] for line in text.splitlines() if line.strip()]
    if tuple(pieces[:4]) != SP_SPECIALS:
        raise CheckpointError(f"{path}: the first pieces are {pieces[:4]}, expected ACORT's {list(SP_SPECIALS)}")
    words = [p[1:] if p.startswith(_WORD_START) else p for p in pieces[4:]]
    seen: set[str] = set()
    for word in words:
        if not word or word in seen:
            raise CheckpointError(f"{path}: the word {word!r} is empty or repeats once the word marker is removed")
        seen.add(word)
    return words


def _digits(num_words: int, base: int) -> int:
    """Digits per word of the official tokenizer: base-``v`` digits of ``N`` (one slot more than edgecap's minimum
    when ``N`` is a power of ``v``)."""
    digits, value = 1, num_words
    while value >= base:
        value //= base
        digits += 1
    return digits


def radix_digits(num_words: int, base: int, checkpoint: str, vocab: str) -> int:
    """The official tokenizer's digits per word for ``num_words`` (words + ``<unk>``), refusing a vocabulary that
    cannot be the model's.

    The official tokenizer derives the digits from the vocabulary alone (base-``v`` digits of ``N``), so a word.vocab
    other than the training one silently changes them. A radix model's base is smaller than its vocabulary (that is
    the point of ACORT's radix tokens), so a vocabulary with fewer words than the base, one digit per word, leaves
    digit classes that stand for no word: either the file is not the one the model was trained with, or the
    checkpoint is not a radix model.
    """
    digits = _digits(num_words, base)
    if digits == 1:
        raise CheckpointError(
            f"{vocab} has {num_words - 1} words, fewer than the checkpoint's radix base {base} ({checkpoint} has "
            f"{base + 3} output classes = base + 3): that is 1 digit per word and {base - num_words} digit classes "
            "that stand for no word. ACORT's radix base is smaller than its vocabulary (768 for ~10k words, 2 digits), "
            "so this is probably not the word.vocab the model was trained with (pass the run's tokenizer/word.vocab)"
        )
    return digits


def _check_shared(arch: dict[str, Any], checkpoint: str) -> None:
    """Refuse a state dict without ACORT's parameter sharing, whatever vocabulary comes with it.

    ORT and ACORT share one layout, and an ORT output layer of ``words + 1`` classes reads as a radix base of
    ``words - 2`` that a real ``word.vocab`` happily fills with two or three digits per word, so neither the names nor
    the vocabulary tell them apart. The architecture does: every released ACORT configuration shares attention
    projections (Share-KV: 3 per attention) and layers ((0x3,1x3), (0x2)), ORT neither.
    """
    if looks_like_acort(arch):
        return
    raise CheckpointError(
        f"{checkpoint} has ORT's architecture, not ACORT's: 4 projections per attention and no shared layers "
        f"(encoder {list(arch['enc_layer_map'])}, decoder {list(arch['dec_layer_map'])}, {arch['vocab_size']} output "
        "classes), where ACORT shares attention projections (Share-KV) and layers; pass --from ort with its "
        "cocotalk.json"
    )


def import_acort(
    checkpoint: str | Path,
    vocab: str | Path | None,
    trust_pickle: bool = False,
    share_att: str = "kv",
    feature_dim: int | None = None,
) -> ImportedRun:
    """Read an official ACORT checkpoint and its ``word.vocab`` into a loaded ``acort-*-ref`` model.

    Args:
        checkpoint: the ``state_dict`` file (``model_best.pth`` …).
        vocab: the tokenizer's ``word.vocab``; ACORT checkpoints do not contain their vocabulary.
        trust_pickle: allow unpickling Python objects (see :func:`read_checkpoint`).
        share_att: what 3 projections per attention mean: ``"kv"`` (ACORT's choice) or ``"qk"``.
        feature_dim: confirms an input width no official backbone gives (features of your own); None: it must be
            the bottom-up features' 2,048.

    Raises:
        CheckpointError: unreadable files, another family's checkpoint (ORT's is told by its unshared architecture),
            a vocabulary that does not fit the radix base.
    """
    if vocab is None:
        raise CheckpointError("ACORT checkpoints do not hold their vocabulary: pass --vocab RUN/tokenizer/word.vocab")
    state = OfficialState(read_checkpoint(checkpoint, trust_pickle), str(checkpoint))
    check_layout(state.names(), "relation-transformer", str(checkpoint), "ACORT")
    arch = infer_relation_transformer(state, share_att)
    _check_shared(arch, str(checkpoint))
    width = check_feature_width(
        arch["feature_dim"], "relation-transformer", "att_embed.0.weight", str(checkpoint), feature_dim
    )
    base = arch["vocab_size"] - 3
    if base < 2:
        raise CheckpointError(f"{checkpoint}: {arch['vocab_size']} output classes is not a radix model (v + 3)")
    words = read_sentencepiece_words(vocab)
    digits = radix_digits(len(words) + 1, base, str(checkpoint), str(vocab))
    fields = {k: arch[k] for k in ("d_model", "d_ff", "heads", "geometry_dim", "share_att")}
    cfg = get_model_cfg("acort-base-ref").replace(
        **fields,
        enc_layer_map=arch["enc_layer_map"],
        dec_layer_map=arch["dec_layer_map"],
        vocab_kind="radix",
        radix_base=base,
    )
    name, overrides = choose_registered(cfg, "acort-base-ref")
    model = create_model(name, vocab_size=arch["vocab_size"], feature_dim=arch["feature_dim"], **overrides)
    converted = convert_relation_transformer(state, arch, model.cfg.max_len)
    state.finish()
    load_converted(model, converted, str(checkpoint))
    radix = RadixVocab(words, base=base, digits=digits)
    max_words = official_max_words(ACORT_MAX_TOKENS, radix.digits)
    notes = [
        width,
        f"layer maps: encoder {list(arch['enc_layer_map'])}, decoder {list(arch['dec_layer_map'])}",
        f"radix base {base}, {len(words)} words, {radix.digits} digits per word",
        f"decoding cap: the official max_seq_length {ACORT_MAX_TOKENS} tokens -> {max_words} complete words",
    ]
    return ImportedRun(model, name, overrides, arch["feature_dim"], radix, max_words, "acort", notes)
