"""A training script's workers do not run the script's imports again (``import torch`` at the
top of it cost every worker a second and 140 MiB) unless something they need was defined in
it: then they do, and the batches are the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")

SCRIPT = """
import json, os, sys

# every import of this file leaves its process id here: the script's own run, and each worker
# that had to import it
with open(os.environ["STOKER_TEST_MARKER"], "a") as f:
    f.write(f"{os.getpid()}\\n")

import numpy as np

from stoker import ArraySpec
from stoker.loader import Loader
from stoker.transforms import Transform


class AddOne(Transform):  # defined in the script: a worker can only get it by importing it
    def __call__(self, img, rng):
        return img + 1

    def output_spec(self, in_spec):
        return in_spec


if __name__ == "__main__":
    x = (np.arange(40 * 6 * 5 * 3) % 200).astype(np.uint8).reshape(40, 6, 5, 3)
    y = np.arange(40)
    in_main = os.environ["STOKER_TEST_IN_MAIN"] == "1"
    with Loader((x, y), batch_size=8, workers=2, transforms=AddOne() if in_main else None) as ld:
        images = np.concatenate([b.images.copy() for b in ld])
        workers = ld.worker_pids()
    want = x + 1 if in_main else x
    print(json.dumps({"same": bool((images == want).all()), "workers": workers}))
"""


@pytest.mark.parametrize("in_main", [False, True])
def test_workers_import_the_script_only_when_it_defines_what_they_run(tmp_path, in_main):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    marker = tmp_path / "imports.txt"
    env = dict(
        os.environ,
        PYTHONPATH=SRC,
        STOKER_TEST_MARKER=str(marker),
        STOKER_TEST_IN_MAIN="1" if in_main else "0",
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["same"]
    imported_in = [int(p) for p in marker.read_text().split()]
    assert imported_in[0] == proc.pid  # the script's own run
    assert len(out["workers"]) == 2
    if in_main:
        assert sorted(imported_in[1:]) == sorted(out["workers"])
    else:
        assert imported_in[1:] == []
