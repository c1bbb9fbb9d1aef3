"""The docs describe how things are now, and stay small and linked (issue 42).

Pure file reads, no stoker import:

- no dated-run phrasing ("the latest run", "an earlier run", "after the ..., on quiet cores",
  "this round", "as of <date>", ...) in ``docs/*.md``: a measurement is the current table with
  its command, and the history of runs lives in git (or as data under ``bench/results/``);
- ``docs/bench.md`` lists exactly the ``bench/bench_*.py`` files there are;
- ``docs/`` holds at most 5,000 lines of markdown, and no file more than 700;
- every relative link in ``docs/*.md`` and ``README.md`` names a file that exists and, for a
  markdown file, an anchor one of its headings makes (GitHub's rule: lowercase, spaces to
  ``-``, punctuation dropped, ``-1``, ``-2`` ... for repeated headings).

Each check is a function of the repository root, so it can be run on another tree too.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MAX_TOTAL_LINES = 5_000
MAX_FILE_LINES = 700

_MONTHS = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
#: phrasing that tells the story of runs rather than how things are; matched case-insensitively
DATED_PATTERNS = [
    r"\bthe latest run\b",
    r"\bthe last run\b",
    r"\bthe previous run\b",
    r"\b(?:an|one|the) earlier run\b",
    r"\b(?:a|the) later run\b",
    r"\ba run before\b",
    r"\bthe run before\b",
    r"\bafter the\b[^.\n]{0,80}\bon quiet cores\b",
    r"\bon quiet cores\b",
    r"\bthis round\b",
    r"\blast round\b",
    r"\bthis stop\b",
    r"\bthis hour\b",
    r"\bin the same hour\b",
    r"\ban hour (?:later|earlier)\b",
    r"\bthe same day\b",
    r"\ba later day\b",
    r"\bthe revision before\b",
    r"\bbefore these changes\b",
    r"\bearlier versions of this page\b",
    r"\bwhen this was written\b",
    r"\b(?:an|the) earlier release\b",
    r"\bthe release before\b",
    r"\bas of (?:\d|today\b|now\b|this\b|" + _MONTHS + r")",
]
_DATED = [re.compile(p, re.IGNORECASE) for p in DATED_PATTERNS]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
_BENCH_NAME = re.compile(r"\bbench_[a-z0-9_]+\.py\b")
_BENCH_ROW = re.compile(r"^\|\s*`(bench_[a-z0-9_]+\.py)")


def doc_files(root: Path = ROOT) -> list[Path]:
    return sorted((root / "docs").glob("*.md"))


def _lines_outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line not inside a fenced code block."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: links reduced to their text, lowercase, every character
    that is not a letter, digit, space, ``-`` or ``_`` dropped, spaces turned into ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a markdown file offers: its headings' slugs (repeats numbered) and explicit
    ``<a id=...>`` anchors."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _lines_outside_fences(path.read_text(encoding="utf-8")):
        found.update(_HTML_ANCHOR.findall(line))
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        found.add(base if k == 0 else f"{base}-{k}")
    return found


def dated_phrases(root: Path = ROOT) -> list[str]:
    """``file:line: phrase`` for every dated-run phrase in ``docs/*.md``."""
    hits = []
    for path in doc_files(root):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for pattern in _DATED:
                m = pattern.search(line)
                if m:
                    hits.append(f"docs/{path.name}:{n}: {m.group(0)!r}")
    return hits


def bench_list_problems(root: Path = ROOT) -> list[str]:
    """Benches missing from ``docs/bench.md``'s table, and ``bench_*.py`` it names that do not
    exist."""
    exist = {p.name for p in (root / "bench").glob("bench_*.py")}
    text = (root / "docs" / "bench.md").read_text(encoding="utf-8")
    rows = {m.group(1) for line in text.splitlines() if (m := _BENCH_ROW.match(line))}
    named = set(_BENCH_NAME.findall(text))
    problems = [f"bench/{name} has no row in docs/bench.md" for name in sorted(exist - rows)]
    problems += [
        f"docs/bench.md names {name}, which is not in bench/" for name in sorted(named - exist)
    ]
    return problems


def size_problems(root: Path = ROOT) -> list[str]:
    counts = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in doc_files(root)}
    problems = [
        f"docs/{name}: {n} lines, more than {MAX_FILE_LINES}"
        for name, n in sorted(counts.items())
        if n > MAX_FILE_LINES
    ]
    total = sum(counts.values())
    if total > MAX_TOTAL_LINES:
        problems.append(f"docs/*.md: {total} lines in all, more than {MAX_TOTAL_LINES}")
    return problems


def link_problems(root: Path = ROOT) -> list[str]:
    """Relative links in ``docs/*.md`` and ``README.md`` to a file that does not exist, or to
    an anchor its markdown does not make."""
    problems = []
    cache: dict[Path, set[str]] = {}
    sources = [*doc_files(root), root / "README.md"]
    for src in sources:
        if not src.exists():
            continue
        where = src.relative_to(root)
        for n, line in _lines_outside_fences(src.read_text(encoding="utf-8")):
            for target in _LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                    continue  # http:, https:, mailto: ...
                path_part, _, anchor = target.partition("#")
                dest = (src.parent / path_part).resolve() if path_part else src.resolve()
                if not dest.exists():
                    problems.append(f"{where}:{n}: {target}: no such file")
                    continue
                if anchor and dest.suffix == ".md":
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if anchor not in cache[dest]:
                        problems.append(f"{where}:{n}: {target}: no such anchor")
    return problems


def test_no_dated_run_phrasing_in_docs() -> None:
    assert dated_phrases() == []


def test_bench_md_lists_exactly_the_benches() -> None:
    assert bench_list_problems() == []


def test_docs_stay_within_their_line_budget() -> None:
    assert size_problems() == []


def test_relative_links_resolve() -> None:
    assert link_problems() == []


def test_slug_follows_github() -> None:
    assert slug("Engines: Linux and portable") == "engines-linux-and-portable"
    assert slug("3. `NAME.crc32c`: per-record checksums") == "3-namecrc32c-per-record-checksums"
    assert slug("Old revision against new: `bench_revisions.py`") == (
        "old-revision-against-new-bench_revisionspy"
    )
    assert slug("Formats: `--format` and `stoker convert`") == "formats---format-and-stoker-convert"
