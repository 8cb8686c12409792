import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgecap.runtime.vocab import (
    UNK,
    RadixVocab,
    VocabError,
    Vocabulary,
    WordVocab,
    build_vocab,
    count_words,
    load_vocab,
    rank_words,
    vocab_from_dict,
)

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None)

CAPTIONS = [
    ["a", "dog", "on", "a", "bench"],
    ["a", "cat", "on", "a", "mat"],
    ["a", "dog", "and", "a", "cat"],
    ["the", "dog", "runs"],
    ["zebra", "<unk>", "<pad>", ""],
]


def _words(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


# ---- building ------------------------------------------------------------------------------------------------------


def test_rank_words_frequency_then_alphabetical():
    counts = count_words(CAPTIONS)
    assert counts["a"] == 6 and "<unk>" not in counts and "<pad>" not in counts and "" not in counts
    # dog 3; cat 2, on 2 (tie -> alphabetical); count-1 words alphabetical.
    assert rank_words(counts, min_count=2) == ["a", "dog", "cat", "on"]
    assert rank_words(counts, min_count=1)[:4] == ["a", "dog", "cat", "on"]
    assert rank_words(counts, min_count=1)[4:] == ["and", "bench", "mat", "runs", "the", "zebra"]
    assert rank_words(counts, min_count=1, max_size=3) == ["a", "dog", "cat"]


def test_rank_words_is_order_independent():
    forward = rank_words(count_words(CAPTIONS), min_count=1)
    backward = rank_words(count_words(reversed(CAPTIONS)), min_count=1)
    assert forward == backward


def test_build_vocab_default_min_count_is_five():
    captions = [["common"]] * 5 + [["rare"]] * 4
    vocab = build_vocab(captions)
    assert isinstance(vocab, WordVocab)
    assert vocab.words == ("common",) and vocab.min_count == 5


@pytest.mark.parametrize(
    ("captions", "kwargs", "match"),
    [
        (["a dog on a bench"], {}, "is a str"),
        ([["a", 3]], {}, "non-string"),
        ([["a"]], {"kind": "bpe"}, "unknown vocab kind"),
        ([["a"]], {"min_count": 0}, "min_count"),
        ([["a"]], {"kind": "radix", "radix_base": 1}, "base"),
    ],
)
def test_build_vocab_rejects_bad_input(captions, kwargs, match):
    with pytest.raises(VocabError, match=match):
        build_vocab(captions, **kwargs)


@pytest.mark.parametrize("bad", [["a", "a"], ["a", ""], ["<eos>"], ["a", 3]])
def test_constructors_reject_bad_word_lists(bad):
    for cls in (WordVocab, RadixVocab):
        with pytest.raises(VocabError):
            cls(bad)


# ---- word vocab ----------------------------------------------------------------------------------------------------


def test_word_vocab_layout():
    vocab = build_vocab(CAPTIONS, min_count=2)
    assert (vocab.kind, vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id) == ("word", 0, 1, 2, 3)
    assert vocab.size == 8 and vocab.tokens_per_word == 1
    assert vocab.encode(["a", "dog", "unicorn", "<unk>", "<pad>"]) == [4, 5, 3, 3, 3]
    assert vocab.id_to_token(0) == "<pad>" and vocab.id_to_token(99) == UNK
    assert "dog" in vocab and "unicorn" not in vocab and UNK not in vocab and 5 not in vocab


def test_word_vocab_decode_handles_specials_and_garbage():
    vocab = WordVocab(["a", "dog"])
    assert vocab.decode([1, 4, 0, 5, 2, 4, 4]) == ["a", "dog"]
    assert vocab.decode([4, 3, 99, -1, 2.5, "x", 5]) == ["a", UNK, UNK, UNK, UNK, UNK, "dog"]
    assert vocab.decode(np.array([1, 4, 5, 2])) == ["a", "dog"]
    assert vocab.decode(torch.tensor([1, 5, 4, 2, 0])) == ["dog", "a"]
    assert vocab.decode_text([4, 5]) == "a dog"
    assert vocab.decode([]) == []


def test_encode_caption_keeps_eos_when_truncating():
    for vocab in (WordVocab(_words(10)), RadixVocab(_words(10), base=3)):
        words = _words(10)
        full = vocab.encode_caption(words)
        assert full[0] == vocab.bos_id and full[-1] == vocab.eos_id
        assert len(full) == vocab.caption_length(10)
        cut = vocab.encode_caption(words, max_words=4)
        assert len(cut) == vocab.caption_length(4) and cut[-1] == vocab.eos_id
        assert vocab.decode(cut) == words[:4]
    with pytest.raises(ValueError):
        WordVocab([]).caption_length(-1)


# ---- radix vocab ---------------------------------------------------------------------------------------------------


def test_radix_layout_matches_acort_reference():
    """771 classes, PAD 0, BOS 769, EOS 770, 2 digits, MSD first, digit k -> token k + 1 (released ACORT code)."""
    vocab = RadixVocab(_words(9997))  # + <unk> = 9998 words, as in the released ACORT tokenizer
    assert (vocab.num_words, vocab.digits, vocab.size) == (9998, 2, 771)
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id) == (0, 769, 770, None)
    assert vocab.unk_index == 9997 and vocab.tokens_per_word == 2
    # The reference's worked examples, shifted by its 4 SentencePiece specials.
    assert vocab.encode(["w0"]) == [1, 1]
    assert vocab.encode(["w1"]) == [1, 2]
    assert vocab.encode(["w796"]) == [2, 29]
    assert vocab.encode(["w9996"]) == [14, 13]
    assert vocab.encode(["never-seen"]) == [14, 14]


@pytest.mark.parametrize(("num_real", "base", "digits"), [(0, 2, 1), (1, 2, 1), (2, 2, 2), (8, 3, 2), (9, 3, 3)])
def test_radix_digits_count_from_last_index(num_real, base, digits):
    assert RadixVocab(_words(num_real), base=base).digits == digits


def test_radix_extra_digits_allowed_but_not_fewer():
    vocab = RadixVocab(_words(5), base=10, digits=3)
    assert vocab.encode(["w4"]) == [1, 1, 5]
    assert vocab.decode([1, 1, 5, 1, 1, 6]) == ["w4", UNK]
    with pytest.raises(VocabError, match="digits"):
        RadixVocab(_words(20), base=10, digits=1)


def test_radix_decode_repairs_invalid_sequences():
    vocab = RadixVocab(["a", "b", "c"], base=2)  # indices a=0 b=1 c=2 unk=3 -> 2 digits
    bos, eos, pad = vocab.bos_id, vocab.eos_id, vocab.pad_id
    a, b, c = vocab.encode(["a"]), vocab.encode(["b"]), vocab.encode(["c"])
    assert vocab.decode([bos, *a, *b, *c, eos, *a]) == ["a", "b", "c"]
    assert vocab.decode([*a, pad, pad]) == ["a"]  # trailing padding between words is skipped
    assert vocab.decode([*a, a[0], eos]) == ["a", UNK]  # EOS in the middle of a word
    assert vocab.decode([*a, a[0]]) == ["a", UNK]  # trailing incomplete word
    assert vocab.decode([a[0], bos, *b]) == [UNK, "b"]  # BOS inside a word poisons it, alignment kept
    assert vocab.decode([a[0], pad, *c]) == [UNK, "c"]
    assert vocab.decode([a[0], 99, -5, b[1], *c]) == [UNK, UNK, "c"]  # out-of-range ids take their slot
    assert vocab.decode([2, 2]) == [UNK]  # index 3 = the unk slot
    big = RadixVocab(["a", "b"], base=4)  # 3 words -> 1 digit; digits 3 is index >= num_words
    assert big.decode([4, 1, 2]) == [UNK, "a", "b"]


def test_radix_max_digit_bounds():
    vocab = RadixVocab(_words(9997))  # limit index 9997 = 13*768 + 13
    assert vocab.max_digit(0, []) == 13
    assert vocab.max_digit(1, [12]) == 767
    assert vocab.max_digit(1, [13]) == 13
    assert vocab.max_digit(1, [14]) == -1
    assert vocab.max_digit(1, [13], allow_unk=False) == 12  # 9996 = 13*768 + 12
    assert RadixVocab([], base=5).max_digit(0, [], allow_unk=False) == -1
    assert RadixVocab([], base=5).max_digit(0, []) == 0
    with pytest.raises(ValueError, match="position_in_word"):
        vocab.max_digit(2, [0, 0])
    with pytest.raises(ValueError, match="prefix_digits"):
        vocab.max_digit(1, [])


@SETTINGS
@given(num_words=st.integers(1, 3000), base=st.integers(2, 1024), allow_unk=st.booleans(), data=st.data())
def test_radix_max_digit_agrees_with_brute_force(num_words, base, allow_unk, data):
    vocab = RadixVocab(_words(num_words - 1), base=base)
    limit = vocab.num_words - (1 if allow_unk else 2)
    index = data.draw(st.integers(0, base**vocab.digits - 1))
    digits = vocab.index_to_digits(index)
    position = data.draw(st.integers(0, vocab.digits - 1))
    prefix = digits[:position]
    # Brute force: the largest digit at `position` for which the smallest completion stays <= limit.
    legal = [
        k for k in range(base) if vocab.digits_to_index([*prefix, k] + [0] * (vocab.digits - position - 1)) <= limit
    ]
    assert vocab.max_digit(position, prefix, allow_unk=allow_unk) == (max(legal) if legal else -1)


@SETTINGS
@given(num_words=st.integers(1, 5000), base=st.integers(2, 1024), data=st.data())
def test_radix_index_round_trip(num_words, base, data):
    vocab = RadixVocab(_words(num_words - 1), base=base)
    assert base ** (vocab.digits - 1) <= max(vocab.num_words - 1, 1) or vocab.digits == 1
    for index in {0, vocab.num_words - 1, data.draw(st.integers(0, vocab.num_words - 1))}:
        digits = vocab.index_to_digits(index)
        assert len(digits) == vocab.digits and all(0 <= d < base for d in digits)
        assert vocab.digits_to_index(digits) == index
        tokens = [vocab.digit_to_token(d) for d in digits]
        assert all(1 <= t <= base for t in tokens)
        assert vocab.decode(tokens) == [vocab.index_to_word(index)]


def test_radix_every_index_round_trips_small():
    for base in (2, 3, 7, 16):
        vocab = RadixVocab(_words(200), base=base)
        for i, word in enumerate(vocab.words):
            assert vocab.decode(vocab.encode([word])) == [word]
            assert vocab.digits_to_index(vocab.index_to_digits(i)) == i


# ---- properties over both kinds -------------------------------------------------------------------------------------

VOCAB_WORDS = _words(300)


@st.composite
def vocabs(draw) -> Vocabulary:
    n = draw(st.integers(0, len(VOCAB_WORDS)))
    if draw(st.booleans()):
        return WordVocab(VOCAB_WORDS[:n])
    return RadixVocab(VOCAB_WORDS[:n], base=draw(st.integers(2, 1024)))


@SETTINGS
@given(vocab=vocabs(), data=st.data())
def test_in_vocab_words_round_trip(vocab, data):
    if not vocab.words:
        return
    words = data.draw(st.lists(st.sampled_from(vocab.words), max_size=20))
    assert vocab.decode(vocab.encode(words)) == words
    assert vocab.decode(vocab.encode_caption(words)) == words
    assert len(vocab.encode(words)) == len(words) * vocab.tokens_per_word


@SETTINGS
@given(vocab=vocabs(), data=st.data())
def test_out_of_vocab_words_become_unk(vocab, data):
    words = data.draw(st.lists(st.text(min_size=1, max_size=5).filter(lambda w: w not in vocab), max_size=8))
    assert vocab.decode(vocab.encode(words)) == [UNK] * len(words)


@SETTINGS
@given(vocab=vocabs(), ids=st.lists(st.integers(-5, 1100), max_size=40))
def test_decode_never_crashes(vocab, ids):
    out = vocab.decode(ids)
    assert all(isinstance(w, str) and w for w in out)
    assert all(w == UNK or w in vocab for w in out)
    eos = ids.index(vocab.eos_id) if vocab.eos_id in ids else len(ids)
    assert len(out) <= eos


# ---- persistence ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["word", "radix"])
def test_save_load_round_trip(tmp_path, kind):
    vocab = build_vocab(CAPTIONS, kind=kind, min_count=1, radix_base=4)
    path = tmp_path / "sub" / "vocab.json"
    vocab.save(path)
    data = json.loads(path.read_text())
    assert data["kind"] == kind and data["version"] == 1
    loaded = load_vocab(path)
    assert type(loaded) is type(vocab) and loaded == vocab and loaded.to_dict() == vocab.to_dict()
    assert loaded.encode(["dog", "unicorn"]) == vocab.encode(["dog", "unicorn"])
    assert sorted(p.name for p in path.parent.iterdir()) == ["vocab.json"]  # no temp file left behind


def test_load_vocab_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_vocab(tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: "{not json", "not a valid JSON"),
        (lambda d: [1, 2], "expected a JSON object"),
        (lambda d: {**d, "kind": "bpe"}, "'kind'"),
        (lambda d: {k: v for k, v in d.items() if k != "kind"}, "'kind'"),
        (lambda d: {**d, "version": 7}, "version"),
        (lambda d: {k: v for k, v in d.items() if k != "words"}, "'words'"),
        (lambda d: {**d, "words": ["a", "a"]}, "twice"),
        (lambda d: {**d, "words": ["a", 1]}, "non-empty string"),
        (lambda d: {**d, "base": "768"}, "'base'"),
        (lambda d: {k: v for k, v in d.items() if k != "digits"}, "'digits'"),
        (lambda d: {**d, "digits": 1}, "digits"),
        (lambda d: {**d, "size": 771}, "'size'"),
        (lambda d: {**d, "bos_id": 768}, "'bos_id'"),
        (lambda d: {**d, "num_words": 3}, "'num_words'"),
        (lambda d: {**d, "digit_order": "lsd_first"}, "digit_order"),
        (lambda d: {**d, "min_count": -2}, "min_count"),
    ],
)
def test_load_vocab_rejects_malformed_radix_file(tmp_path, edit, match):
    vocab = RadixVocab(_words(30), base=4)  # 31 words -> 3 digits
    edited = edit(vocab.to_dict())
    path = tmp_path / "vocab.json"
    path.write_text(edited if isinstance(edited, str) else json.dumps(edited))
    with pytest.raises(VocabError, match=match) as info:
        load_vocab(path)
    assert str(path) in str(info.value)


def test_load_vocab_rejects_mismatched_word_file(tmp_path):
    data = WordVocab(["a", "b"]).to_dict()
    data["unk_id"] = 0
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps(data))
    with pytest.raises(VocabError, match="unk_id"):
        load_vocab(path)


def test_vocab_from_dict_minimal_fields():
    assert vocab_from_dict({"kind": "word", "words": ["a"]}).encode(["a"]) == [4]
    assert vocab_from_dict({"kind": "radix", "words": ["a"], "base": 2, "digits": 1}).size == 5


@pytest.mark.parametrize("kind", [[], {}, ["word"], 3, None])
def test_vocab_from_dict_rejects_unhashable_or_odd_kind(kind):
    """Found by tests/fuzz: a list or object under 'kind' raised TypeError (unhashable) instead of VocabError."""
    with pytest.raises(VocabError, match="field 'kind'"):
        vocab_from_dict({"kind": kind, "version": 1, "words": ["a"]})
