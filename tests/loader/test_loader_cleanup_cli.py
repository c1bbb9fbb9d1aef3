"""`stoker cleanup` removes segments of dead owners and keeps live ones."""

from __future__ import annotations

import os

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
