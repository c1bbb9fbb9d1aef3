"""F-01: crafted bad inputs (faults.md B1, B3, B9) each end in a documented error.

The cases come from ``scripts/make_fault_corpus.py``; ``_reliability_util`` says how each entry
point is run and judged. A case the code fails today because of a defect another change is
fixing carries a strict xfail naming the defect (it turns into a failure once fixed, so the
mark gets removed).
"""

from __future__ import annotations

import pytest
from _reliability_util import judge_pack, load_corpus_module, pack_once, run_case

CASES = load_corpus_module().corpus_cases()


def _param(case):
    marks = [pytest.mark.xfail(strict=True, reason=case.defect)] if case.defect else []
    return pytest.param(case, id=case.id, marks=marks)


def test_corpus_is_large_enough():
    assert len(CASES) >= 300, len(CASES)
    assert {c.group for c in CASES} == {"B1", "B3", "B9"}


@pytest.fixture(scope="module")
def pack_run(corpus_root, tmp_path_factory):
    return pack_once(corpus_root / "B1" / "pack_src", tmp_path_factory.mktemp("packed"))


@pytest.mark.parametrize("case", [_param(c) for c in CASES if c.entry != "pack"])
def test_bad_input(case, corpus_root, tmp_path, figures):
    outcome = run_case(case, corpus_root, tmp_path)
    figures.add("F-01", tried=1, ok=int(outcome.ok))
    assert outcome.ok, f"{case.id} ({case.entry} on {case.target}): {outcome.detail}"


@pytest.mark.parametrize("case", [_param(c) for c in CASES if c.entry == "pack"])
def test_bad_pack_input(case, pack_run, figures):
    outcome = judge_pack(case, pack_run)
    figures.add("F-01", tried=1, ok=int(outcome.ok))
    assert outcome.ok, f"{case.id}: {outcome.detail}"
