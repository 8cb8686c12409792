"""Import official ACORT checkpoints (jiahuei/sparse-image-captioning, ``relation_transformer`` with radix tokens).

The checkpoint is the model's ``state_dict`` (layout: :mod:`edgecap.interop._relation_transformer`); the vocabulary
is the SentencePiece ``word.vocab`` of the run's ``tokenizer/`` folder. Its radix layout (PAD 0, digits 1…v, BOS
v+1, EOS v+2, most-significant digit first, ``<unk>`` the last word index) is edgecap's :class:`RadixVocab`, so token
ids carry over unchanged; only the word list is read: SentencePiece ids 0-3 are ``<pad> <unk> <bos> <eos>`` and
word id ``w`` has radix index ``w - 4``.
"""

from __future__ import annotations

from pathlib import Path

from edgecap.data.vocab import RadixVocab
from edgecap.interop._mapping import OfficialState, load_converted
from edgecap.interop._reading import CheckpointError, read_checkpoint
from edgecap.interop._relation_transformer import convert_relation_transformer, infer_relation_transformer
from edgecap.interop._run import ImportedRun, choose_registered
from edgecap.models import create_model, get_model_cfg

__all__ = ["SP_SPECIALS", "import_acort", "read_sentencepiece_words"]

#: SentencePiece ids 0-3 of the ACORT tokenizer (trained with pad_id=0, unk_id=1, bos_id=2, eos_id=3).
SP_SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")
#: SentencePiece marks the start of a word with U+2581; a word-level model puts it on every piece.
_WORD_START = "\u2581"
#: The official decoder runs at most 26 steps (max_seq_length): 12 words and EOS at 2 tokens per word.
ACORT_MAX_WORDS = 12


def read_sentencepiece_words(path: str | Path) -> list[str]:
    """Words of a SentencePiece ``.vocab`` file (``piece<TAB>score`` per line, in id order), specials excluded.

    Raises:
        CheckpointError: the file is missing, its first four pieces are not ACORT's specials, or a word repeats.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"vocabulary file not found: {path}")
    if path.suffix == ".model":
        raise CheckpointError(f"{path} is a SentencePiece model; pass the .vocab file beside it")
    pieces = [line.split("\t")[0] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
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


def import_acort(
    checkpoint: str | Path, vocab: str | Path | None, trust_pickle: bool = False, share_att: str = "kv"
) -> ImportedRun:
    """Read an official ACORT checkpoint and its ``word.vocab`` into a loaded ``acort-*-ref`` model.

    Args:
        checkpoint: the ``state_dict`` file (``model_best.pth`` …).
        vocab: the tokenizer's ``word.vocab``; ACORT checkpoints do not contain their vocabulary.
        trust_pickle: allow unpickling Python objects (see :func:`read_checkpoint`).
        share_att: what 3 projections per attention mean: ``"kv"`` (ACORT's choice) or ``"qk"``.
    """
    if vocab is None:
        raise CheckpointError("ACORT checkpoints do not hold their vocabulary: pass --vocab RUN/tokenizer/word.vocab")
    state = OfficialState(read_checkpoint(checkpoint, trust_pickle), str(checkpoint))
    arch = infer_relation_transformer(state, share_att)
    base = arch["vocab_size"] - 3
    if base < 2:
        raise CheckpointError(f"{checkpoint}: {arch['vocab_size']} output classes is not a radix model (v + 3)")
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
    words = read_sentencepiece_words(vocab)
    radix = RadixVocab(words, base=base, digits=_digits(len(words) + 1, base))
    notes = [
        f"layer maps: encoder {list(arch['enc_layer_map'])}, decoder {list(arch['dec_layer_map'])}",
        f"radix base {base}, {len(words)} words, {radix.digits} digits per word",
    ]
    return ImportedRun(model, name, overrides, arch["feature_dim"], radix, ACORT_MAX_WORDS, "acort", notes)
