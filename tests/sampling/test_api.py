"""The public surface of stoker.sampling and stoker.train, and their framework-free imports."""

from __future__ import annotations

import subprocess
import sys

import stoker.sampling
import stoker.train


def test_all_is_sorted_and_importable():
    for mod in (stoker.sampling, stoker.train):
        assert mod.__all__ == sorted(mod.__all__)
        for name in mod.__all__:
            assert getattr(mod, name) is not None


def test_importing_sampling_and_train_loads_no_framework():
    code = (
        "import sys, stoker.sampling, stoker.train; "
        "bad = [m for m in ('torch', 'keras', 'tensorflow', 'cv2') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
