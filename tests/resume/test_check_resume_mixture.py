"""check-resume on a mixture of two sets (RecordIO and TFRecord): exact across kills and from 4
to 3 ranks with random augmentation; a transform that draws from numpy's global generator
fails, naming the first differing sample, also when it is B's chain alone (``PerSet``)."""

from __future__ import annotations

import json

import pytest
from resume_helpers import GlobalRandomFlip, augment

from stoker.cli import main
from stoker.resume import LoaderSpec, check_resume
from stoker.sampling import MixtureOrder
from stoker.transforms import Compose, PerSet

pytestmark = pytest.mark.timeout(300)


def _spec(sets, transforms) -> LoaderSpec:
    return LoaderSpec(
        (sets["recordio"], sets["tfrecord"]),
        batch_size=4,
        transforms=transforms,
        shuffle=True,
        seed=3,
        workers=0,
        options={"weights": [0.7, 0.3]},
    )


def test_a_mixture_resumes_exactly_from_4_to_3_ranks(sets):
    r = check_resume(_spec(sets, augment()), kills=2, world_size=4, resume_on=3, epochs=2, seed=1)
    assert r.passed, str(r)
    assert [x["world_size"] for x in r.resumes] == [3, 3]
    assert r.resumes[0]["resumed_from"] is not None


def test_a_mixture_with_a_global_rng_transform_fails_naming_the_sample(sets, capsys):
    """``stoker check-resume SET_A --mix-with SET_B --weights ...``, as a user runs it."""
    argv = ["check-resume", sets["recordio"], "--mix-with", sets["tfrecord"]]
    argv += ["--weights", "0.7,0.3", "--transforms", "resume_helpers:GlobalRandomFlip"]
    argv += ["--batch-size", "4", "--workers", "0", "--kills", "1", "--json"]
    code = main(argv)
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["passed"] is False
    d = out["difference"]
    assert d["why"] == "pixels" and d["got_index"] == d["expected_index"]


@pytest.mark.parametrize("bad", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_one_set_chain_on_a_global_rng_fails_naming_a_sample_of_that_set(sets, bad):
    """One set's chain draws from numpy's global generator, the other's from the rng handed
    in: the first differing sample named is one of that set's (B's, then A's), its index the
    same in both runs."""
    chains = [augment(), augment()]
    chains[bad] = Compose([*augment().transforms, GlobalRandomFlip()])
    r = check_resume(_spec(sets, PerSet(chains)), kills=1, world_size=1, epochs=1, seed=1)
    d = r.difference
    assert not r.passed and d is not None, str(r)
    assert d.why == "pixels" and d.got_index == d.expected_index, str(r)
    assert MixtureOrder([48, 48], [0.7, 0.3]).set_of([d.got_index]).tolist() == [bad], str(r)
