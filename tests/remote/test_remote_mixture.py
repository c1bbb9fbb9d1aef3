"""A mixture of two sets in object storage (the loopback S3 server) read in shard order through
one node cache: with room for 1.1x both sets it runs and delivers the local mixture's batches;
with 0.3x it is refused at open naming each set's share (the module's timeout is the
watchdog: a stall fails the test)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import stoker
from stoker.storage.cache import MARKER_RESERVE
from storage_doubles import upload_tree

pytestmark = pytest.mark.timeout(120)


def _set_bytes(folder: str) -> int:
    """The bytes a set takes in the shard cache: its shards' files, each with its marker."""
    names = [n for n in os.listdir(folder) if n.startswith("train-")]
    return sum(os.path.getsize(os.path.join(folder, n)) + MARKER_RESERVE for n in names)


def _epoch(loader) -> list[tuple]:
    return [(b.indices.copy(), b.source.copy(), b.images.copy()) for b in loader]


@pytest.mark.parametrize("fraction", [1.1, 0.3])
def test_two_remote_sets_share_one_cache_budget(s3env, s3_server, packed, cache_dir, fraction):
    upload_tree(packed, f"s3://{s3env}/a")
    upload_tree(packed, f"s3://{s3env}/b")
    urls = [f"s3://{s3env}/{p}/train.stoker.json" for p in ("a", "b")]
    local = os.path.join(packed, "train.stoker.json")
    limit = int(fraction * 2 * _set_bytes(packed))
    kw = dict(weights=[0.6, 0.4], batch_size=8, shuffle="shards", seed=4, workers=2)
    with stoker.Loader([local, local], **kw) as ld:
        want = _epoch(ld)
    try:
        ld = stoker.Loader(urls, cache_dir=cache_dir, cache_limit=limit, **kw)
    except stoker.CacheFullError as e:
        text = str(e)
        assert fraction < 1 and "do not fit the shard cache together" in text
        assert "set 0 (" in text and "set 1 (" in text and "weight 0.6" in text
        claims = os.path.join(cache_dir, "claims")  # nothing left claimed
        assert not os.path.isdir(claims) or not os.listdir(claims)
        return
    with ld:
        got = _epoch(ld)
    assert len(got) == len(want)
    assert all(all(np.array_equal(x, y) for x, y in zip(p, q)) for p, q in zip(got, want))
    assert fraction > 1 or len(got) > 0
