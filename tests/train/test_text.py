"""normalize_punctuation on mixed CJK/ASCII text, and label_stats."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.train import label_stats, normalize_punctuation


@pytest.mark.parametrize(
    ("text", "ascii_form"),
    [
        ("你好，世界！", "你好,世界!"),
        ("他说：“明天见。”", '他说:"明天见."'),
        ("问题？答案；结束", "问题?答案;结束"),
        ("（括号）【方括号】《书名》", "(括号)[方括号]<书名>"),
        ("苹果、香蕉", "苹果,香蕉"),
        ("等等……", "等等......"),
        ("破折号——后面", "破折号--后面"),
        ("全角ＡＢＣ１２３＃＄％", "全角ABC123#$%"),
        ("空\u3000格", "空 格"),
        ("半角｡｢引用｣､", '半角."引用",'),
        ("‘单引号’", "'单引号'"),
        ("mixed, already ascii: ok!", "mixed, already ascii: ok!"),
        ("张三·李四", "张三·李四"),  # no ASCII counterpart: unchanged
    ],
)
def test_to_ascii(text, ascii_form):
    assert normalize_punctuation(text) == ascii_form
    assert normalize_punctuation(ascii_form) == ascii_form


@pytest.mark.parametrize(
    ("text", "full"),
    [
        ('他说:"明天见."', "他说：“明天见。”"),
        ("价格3.5元,共1,000个,12:30到", "价格3.5元，共1,000个，12:30到"),  # numbers keep ASCII
        ("e-mail和don't", "e-mail和don't"),
        ("等等......好", "等等……好"),
        ("破折号--后面", "破折号——后面"),
        ("(a)[b]<c>", "（a）【b】《c》"),
        ("'单' '双'", "‘单’ ‘双’"),
        ("100%#", "100％＃"),
    ],
)
def test_to_fullwidth(text, full):
    assert normalize_punctuation(text, to="fullwidth") == full


@pytest.mark.parametrize(
    "canonical",
    [
        "他说：“明天见。”",
        "苹果，香蕉；橘子？",
        "（注）【一】《三体》……完——",
        "价格3.5元，共1,000个",
    ],
)
def test_round_trip_of_canonical_chinese_text(canonical):
    ascii_form = normalize_punctuation(canonical)
    assert normalize_punctuation(ascii_form, to="fullwidth") == canonical


ALPHABET = st.sampled_from(
    list("你好世界abcXYZ019 ,.;:?!\"'()[]<>-~…—、。，；：？！“”‘’（）【】《》「」ＡＢ１％\u3000·")
)


@settings(max_examples=200, deadline=None)
@given(st.text(ALPHABET, max_size=40))
def test_both_directions_agree_and_are_idempotent(text):
    a = normalize_punctuation(text)
    f = normalize_punctuation(text, to="fullwidth")
    assert normalize_punctuation(a) == a
    assert normalize_punctuation(f, to="fullwidth") == f
    assert normalize_punctuation(f) == a
    assert normalize_punctuation(a, to="fullwidth") == f
    # one form per mark: no full-width or CJK variant of an ASCII mark survives to="ascii"
    assert not any(ch in a for ch in "，。；：？！“”‘’（）【】《》「」、…—ＡＢ１％\u3000")


def test_bad_arguments():
    with pytest.raises(ValueError, match="to must be"):
        normalize_punctuation("x", to="half")
    with pytest.raises(TypeError):
        normalize_punctuation(b"x")


def test_label_stats():
    texts = ["你好，世界", "你好, world", "好的；", "ok;", ""]
    s = label_stats(texts)
    assert s.num_texts == 5
    assert s.num_chars == sum(map(len, texts))
    assert s.char_counts["好"] == 3 and s.char_counts["你"] == 2
    assert s.vocabulary[0] == "好"  # most frequent first
    assert s.frequent(1) == [("好", 3)]
    assert s.punctuation_variants == {",": [",", "，"], ";": [";", "；"]}
    assert s.length_counts == {0: 1, 3: 2, 5: 1, 9: 1}
    assert (s.min_length, s.max_length) == (0, 9)
    assert s.mean_length == pytest.approx(s.num_chars / 5)
    assert set(s.rare(2)) == set("世界，, wrld的；k;")
    d = s.to_dict()
    assert d["vocabulary_size"] == len(s.vocabulary)
    # after normalisation only one form is left
    assert label_stats(normalize_punctuation(t) for t in texts).punctuation_variants == {}
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        label_stats(["a", 3])
