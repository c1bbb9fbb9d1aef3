"""check-resume on a set read from the loopback S3 server through the shard cache: every child
reads the bucket (the AWS variables travel in its environment), and a resume after a SIGKILL
delivers exactly the uninterrupted run's samples."""

from __future__ import annotations

import pytest

from stoker.resume import LoaderSpec, check_resume
from stoker.transforms import Compose, HorizontalFlip, RandomCrop


@pytest.mark.parametrize(
    "kills, world_size, resume_on",
    [(1, 1, 1), pytest.param(2, 2, 1, marks=pytest.mark.slow)],
)
def test_a_remote_set_in_shard_order_resumes_exactly(
    remote_set, cache_dir, kills, world_size, resume_on
):
    spec = LoaderSpec(
        remote_set.url,
        batch_size=8,
        transforms=Compose([RandomCrop(40), HorizontalFlip()]),
        shuffle="shards",
        seed=2,
        workers=0,
        options={"cache_dir": cache_dir},
    )
    r = check_resume(
        spec, kills=kills, world_size=world_size, resume_on=resume_on, epochs=2, seed=3
    )
    assert r.passed, str(r)
    assert len(r.kills) == kills and r.resumes[0]["resumed_from"] is not None
    assert r.resumes[0]["world_size"] == resume_on
