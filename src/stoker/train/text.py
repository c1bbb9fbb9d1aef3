"""OCR label hygiene: one form per punctuation mark, and vocabulary statistics.

Seed 001: a CTC or attention OCR model sees the Chinese ``；`` and the ASCII ``;`` as the same
shape, so a training set that labels both ways teaches it to guess. Pick one form with
:func:`normalize_punctuation` before packing; :func:`label_stats` shows which marks appear in
several forms, the characters too rare to learn and the label lengths (for
:class:`~stoker.sampling.LengthBuckets`).

The table (``to="ascii"``; ``to="fullwidth"`` maps back to the first form in each row):

=================================  ======  ====================================================
CJK / full-width                   ASCII   note
=================================  ======  ====================================================
，(U+FF0C)  、(U+3001)  ､(U+FF64)  ``,``   、 (enumeration comma) has no ASCII form: becomes ,
。(U+3002)  ｡(U+FF61)  ．(U+FF0E)  ``.``   。 is the ideographic full stop
；：？！                           ``;:?!`` exact (full-width forms)
“ ”  「 」  ｢ ｣  ＂               ``"``   open/close is lost; ``fullwidth`` re-pairs “ ” in turn
‘ ’  『 』  ＇                     ``'``   as above with ‘ ’
（ ）                              ``( )`` exact
【 】  〔 〕  ［ ］                ``[ ]`` 【】 and 〔〕 have no ASCII form: become [ ]
《 》  〈 〉  ＜ ＞                ``< >`` book-title marks have no ASCII form: become < >
…  (U+2026)                        ``...`` one character becomes three (…… becomes ......)
—  (U+2014)  ―  –   －             ``-``   —— (Chinese dash) becomes --
～  〜                              ``~``
U+3000 ideographic space           space   ``fullwidth`` leaves spaces alone
U+FF01..U+FF5E (Ａ, １, ＃ ...)     U+0021..U+007E exact; ``fullwidth`` leaves letters and digits alone
=================================  ======  ====================================================

``·`` (U+00B7, the name separator) and other marks without an ASCII counterpart are left as
they are.

``to="fullwidth"`` first normalises to ASCII (so every variant converges), then writes the
Chinese form of each ASCII mark, except a mark between two ASCII letters or digits, which stays
ASCII (``3.14``, ``1,000``, ``12:30``, ``e-mail``, ``don't``). Both directions are idempotent and
``normalize_punctuation(normalize_punctuation(s, to="fullwidth"), to="ascii") ==
normalize_punctuation(s, to="ascii")`` for every string.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["LabelStats", "label_stats", "normalize_punctuation"]

_TO_ASCII: dict[int, str] = {cp: chr(cp - 0xFEE0) for cp in range(0xFF01, 0xFF5F)}
_TO_ASCII.update(
    {
        0x3000: " ",
        0x3001: ",",
        0xFF64: ",",
        0x3002: ".",
        0xFF61: ".",
        0x201C: '"',
        0x201D: '"',
        0x300C: '"',
        0x300D: '"',
        0xFF62: '"',
        0xFF63: '"',
        0x2018: "'",
        0x2019: "'",
        0x300E: "'",
        0x300F: "'",
        0x3010: "[",
        0x3011: "]",
        0x3014: "[",
        0x3015: "]",
        0x300A: "<",
        0x300B: ">",
        0x3008: "<",
        0x3009: ">",
        0x2026: "...",
        0x2014: "-",
        0x2015: "-",
        0x2013: "-",
        0x301C: "~",
    }
)

# ASCII mark -> Chinese form (the rest of ASCII punctuation goes to its U+FF01.. form)
_TO_CJK: dict[str, str] = {
    ",": "\uff0c",
    ".": "\u3002",
    ";": "\uff1b",
    ":": "\uff1a",
    "?": "\uff1f",
    "!": "\uff01",
    "(": "\uff08",
    ")": "\uff09",
    "[": "\u3010",
    "]": "\u3011",
    "<": "\u300a",
    ">": "\u300b",
    "~": "\uff5e",
    "...": "\u2026",
    "--": "\u2014\u2014",
}
_QUOTES = {'"': ("\u201c", "\u201d"), "'": ("\u2018", "\u2019")}
_ASCII_MARK = re.compile(r"\.\.\.|--|[!-/:-@\[-`{-~]")


def _is_ascii_alnum(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


def normalize_punctuation(text: str, *, to: str = "ascii") -> str:
    """``text`` with every punctuation mark in one form: ``to="ascii"`` or ``to="fullwidth"``
    (the Chinese forms). See the module docstring for the table.

    >>> normalize_punctuation("你好，世界！（测试）")
    '你好,世界!(测试)'
    >>> normalize_punctuation('他说:"好的."价格3.5元', to="fullwidth")
    '他说：“好的。”价格3.5元'
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if to not in ("ascii", "fullwidth"):
        raise ValueError(f"to must be 'ascii' or 'fullwidth', got {to!r}")
    plain = text.translate(_TO_ASCII)
    if to == "ascii":
        return plain
    open_quote = {'"': True, "'": True}

    def repl(m: re.Match[str]) -> str:
        mark = m.group(0)
        before = plain[m.start() - 1] if m.start() > 0 else ""
        after = plain[m.end()] if m.end() < len(plain) else ""
        if before and after and _is_ascii_alnum(before) and _is_ascii_alnum(after):
            return mark
        if mark in _QUOTES:
            first = open_quote[mark]
            open_quote[mark] = not first
            return _QUOTES[mark][0 if first else 1]
        cjk = _TO_CJK.get(mark)
        if cjk is not None:
            return cjk
        return "".join(chr(ord(c) + 0xFEE0) for c in mark)

    return _ASCII_MARK.sub(repl, plain)


@dataclass(frozen=True)
class LabelStats:
    """Vocabulary and length statistics of a set of text labels (see :func:`label_stats`)."""

    num_texts: int
    num_chars: int
    char_counts: dict[str, int]
    length_counts: dict[int, int]
    punctuation_variants: dict[str, list[str]] = field(default_factory=dict)

    @property
    def vocabulary(self) -> list[str]:
        """Every character seen, most frequent first."""
        return list(self.char_counts)

    @property
    def min_length(self) -> int:
        return min(self.length_counts, default=0)

    @property
    def max_length(self) -> int:
        return max(self.length_counts, default=0)

    @property
    def mean_length(self) -> float:
        return self.num_chars / self.num_texts if self.num_texts else 0.0

    def rare(self, min_count: int) -> dict[str, int]:
        """Characters seen fewer than ``min_count`` times (too few to learn)."""
        return {ch: c for ch, c in self.char_counts.items() if c < min_count}

    def frequent(self, top: int = 10) -> list[tuple[str, int]]:
        """The ``top`` most frequent characters with their counts."""
        return list(self.char_counts.items())[:top]

    def to_dict(self) -> dict:
        return {
            "num_texts": self.num_texts,
            "num_chars": self.num_chars,
            "vocabulary_size": len(self.char_counts),
            "min_length": self.min_length,
            "max_length": self.max_length,
            "mean_length": self.mean_length,
            "char_counts": dict(self.char_counts),
            "length_counts": {str(k): v for k, v in self.length_counts.items()},
            "punctuation_variants": dict(self.punctuation_variants),
        }


def label_stats(texts: Iterable[str]) -> LabelStats:
    """Character counts (most frequent first), label-length histogram, and the punctuation
    marks that occur in more than one form (ASCII form -> the forms seen).

    >>> s = label_stats(["你好，世界", "hi, there"])
    >>> s.punctuation_variants
    {',': [',', '，']}
    >>> s.max_length
    9
    """
    counts: Counter[str] = Counter()
    lengths: Counter[int] = Counter()
    n = 0
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(t).__name__}")
        counts.update(t)
        lengths[len(t)] += 1
        n += 1
    ordered = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    groups: dict[str, set[str]] = {}
    for ch in counts:
        plain = ch.translate(_TO_ASCII)
        if plain != ch and not ch.isalnum() and not plain.isspace():
            groups.setdefault(plain, set()).add(ch)
    for plain in list(groups):
        if plain in counts:
            groups[plain].add(plain)
    variants = {k: sorted(v) for k, v in sorted(groups.items()) if len(v) > 1}
    return LabelStats(
        num_texts=n,
        num_chars=sum(ch * c for ch, c in lengths.items()),
        char_counts=ordered,
        length_counts=dict(sorted(lengths.items())),
        punctuation_variants=variants,
    )
