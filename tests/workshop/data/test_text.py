import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgecap.runtime.text import clean_caption, truncate_words


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            "A man with a red helmet on a small moped on a dirt road. ",
            "a man with a red helmet on a small moped on a dirt road",
        ),
        ("A man's T-shirt.", "a mans tshirt"),
        ("Two dogs,cats and/or birds!!", "two dogs cats and or birds"),
        ("  multiple\tspaces\nand\r\nnewlines  ", "multiple spaces and newlines"),
        ("It’s a “quoted” word — really", "its a quoted word really"),
        ("Café DÉJÀ vu", "cafe deja vu"),
        ("cafe\u0301 ｆｕｌｌｗｉｄｔｈ", "cafe fullwidth"),
        ("zero\u200bwidth soft\u00adhyphen", "zerowidth softhyphen"),
        ("İstanbul", "istanbul"),
        ("3 people, 2 dogs & 1 cat", "3 people 2 dogs 1 cat"),
        ("日本 の 猫", "日本 の 猫"),
        ("...!?", ""),
        ("", ""),
    ],
)
def test_clean_caption(raw, expected):
    assert clean_caption(raw) == expected.split()


def test_clean_caption_max_words():
    assert clean_caption("one two three four", max_words=2) == ["one", "two"]
    assert clean_caption("one two", max_words=0) == []
    assert clean_caption("one two", max_words=10) == ["one", "two"]


def test_clean_caption_rejects_non_str():
    with pytest.raises(TypeError, match="str"):
        clean_caption(["a", "b"])  # type: ignore[arg-type]


def test_truncate_words():
    assert truncate_words(("a", "b", "c"), None) == ["a", "b", "c"]
    assert truncate_words(["a", "b", "c"], 1) == ["a"]
    with pytest.raises(ValueError, match="max_words"):
        truncate_words(["a"], -1)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.text())
def test_clean_caption_invariants(text):
    words = clean_caption(text)
    for word in words:
        assert word and all(ch.isalnum() for ch in word)
        assert word == word.lower()
    # Cleaning is idempotent: cleaned words survive a second pass unchanged.
    assert clean_caption(" ".join(words)) == words
