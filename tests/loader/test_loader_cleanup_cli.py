"""Shared-memory segments: `stoker cleanup` removes those of dead owners and keeps live ones;
a worker maps a slot's pages in one call."""

from __future__ import annotations

import json
import os

import pytest

from stoker.cli import main
from stoker.loader import _shm


def test_cleanup_cli(capsys):
    dead = "stoker_999999998_5_cli"
    open(f"/dev/shm/{dead}", "wb").close()
    live, _mapping = _shm.create_segment(4096)
    try:
        assert main(["cleanup", "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert live.name not in out
        if os.path.exists(f"/dev/shm/{dead}"):  # (another test run may have swept it already)
            assert f"would remove /dev/shm/{dead}" in out
        assert main(["cleanup"]) == 0
        assert "stale segment(s)" in capsys.readouterr().out
        assert not os.path.exists(f"/dev/shm/{dead}")
        assert os.path.exists(live.path)
    finally:
        live.unlink()


def _minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif(
    tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit()) < (5, 14),
    reason="MADV_POPULATE_WRITE needs Linux 5.14",
)
def test_cleanup_json_lists_the_segments_of_dead_owners(capsys):
    dead = "stoker_999999997_5_json"
    open(f"/dev/shm/{dead}", "wb").close()
    try:
        assert main(["cleanup", "--dry-run", "--json"]) == 0
        dry = json.loads(capsys.readouterr().out)
        assert dry["dry_run"] is True and f"/dev/shm/{dead}" in dry["removed"]
        assert dry["count"] == len(dry["removed"])
        assert os.path.exists(f"/dev/shm/{dead}")
        assert main(["cleanup", "--json"]) == 0
        done = json.loads(capsys.readouterr().out)
        assert done["dry_run"] is False and f"/dev/shm/{dead}" in done["removed"]
        assert not os.path.exists(f"/dev/shm/{dead}")
    finally:
        if os.path.exists(f"/dev/shm/{dead}"):
            os.unlink(f"/dev/shm/{dead}")


# ---- stoker.torch without torch ---------------------------------------------------------


def test_populate_maps_a_slot_in_one_call(shm_names):
    # a worker maps the pages of its rows in one call before its first write there, instead
    # of taking a page fault per 4 KiB while it writes
    pages = 2048
    seg, mapping = _shm.create_segment(pages * 4096 + 100)
    try:
        mem = mapping.array()
        cold, warm = mem[100 : 100 + pages * 2048], mem[100 + pages * 2048 :]
        before = _minor_faults()
        cold[::1024] = 1  # plain writes: about one fault per page
        plain = _minor_faults() - before
        _shm.populate(warm)
        before = _minor_faults()
        warm[::1024] = 2
        after_populate = _minor_faults() - before
        assert plain >= pages // 2 - 10
        assert after_populate < 20
        assert int(warm[::1024].min()) == 2 and int(cold[::1024].min()) == 1
        _shm.populate(mem[:0])  # nothing to do: no error
        del mem, cold, warm
    finally:
        seg.unlink()
