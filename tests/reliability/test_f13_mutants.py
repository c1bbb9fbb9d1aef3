"""F-13: the fault tests fail when the guard they test is removed (mutation score).

Each mutant copies ``src/`` to a temporary folder, removes one guard with a targeted text edit
(the edit is asserted to apply), and runs the reliability tests that exercise that guard in a
child ``pytest`` whose ``PYTHONPATH`` puts the patched tree first. The mutant is *killed* when
those tests fail (exit status 1: failures, not a collection error).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = "tests/reliability"

#: name -> (file under src/stoker, text, replacement, test file (in tests/reliability unless
#: it is a path from the repository root), -k expression)
MUTANTS = {
    "verify: CRC32C comparison": (
        "formats/recordio/verify.py",
        "bad = sel[have[where[sel]] != stored[sel]]",
        "bad = sel[:0]",
        "test_f03_bitflips.py",
        "test_verify_payload_bits and sample",
    ),
    "framing: length bounded by the file size": (
        "formats/recordio/framing.py",
        "if pos + 8 + pad4(length) > size:",
        "if False:",
        "test_guard_reasons.py",
        "length_past_the_end",
    ),
    "framing: magic check": (
        "formats/recordio/framing.py",
        "if magic != MAGIC:",
        "if False:",
        "test_f01_bad_inputs.py",
        "magic-bit-0 and read-nocrc",
    ),
    "header: IRHeader flag bound": (
        "formats/recordio/header.py",
        "if need > len(mv):",
        "if False:",
        "test_guard_reasons.py",
        "label_count_larger",
    ),
    ".idx: duplicate keys": (
        "formats/recordio/index.py",
        "if n > 1 and not bool(np.all(keys[1:] > keys[:-1])):",
        "if False:",
        "test_f01_bad_inputs.py",
        "idx-dup",
    ),
    "manifest: size cap": (
        "formats/manifest_json.py",
        ["if size > max_bytes:", "if len(raw) > max_bytes:"],
        "if False:",
        "test_f01_bad_inputs.py",
        "manifest-oversize-read",
    ),
    "unpack: class names with '/'": (
        "cli/unpack.py",
        'or "/" in name',
        "",
        "test_f01_bad_inputs.py",
        "unpack-class-2",
    ),
    "pack: max_pixels bomb check": (
        "pack/images.py",
        "if w * h > max_pixels:",
        "if False:",
        "tests/pack/test_images.py",
        "bomb",
    ),
}


def _patched_tree(tmp: Path, rel: str, old: str | list[str], new: str) -> Path:
    src = tmp / "src"
    shutil.copytree(REPO / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
    target = src / "stoker" / rel
    text = target.read_text()
    for o in [old] if isinstance(old, str) else old:
        assert text.count(o) >= 1, f"the guard {o!r} is no longer in {rel}: update the mutant"
        text = text.replace(o, new)
    target.write_text(text)
    return src


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_is_killed(name, tmp_path, figures):
    rel, old, new, test_file, expr = MUTANTS[name]
    src = _patched_tree(tmp_path, rel, old, new)
    env = dict(os.environ, PYTHONPATH=str(src), STOKER_EXPECT_SRC=str(src))
    env.pop("STOKER_FIGURES_JSON", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-x",
            test_file if "/" in test_file else f"{HERE}/{test_file}",
            "-k",
            expr,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=850,
        check=False,
    )
    killed = proc.returncode == 1
    figures.add(
        "F-13", tried=1, ok=int(killed), note=f"{name}: {'killed' if killed else 'SURVIVED'}"
    )
    assert proc.returncode in (0, 1), f"child pytest could not run: {proc.stdout[-1500:]}"
    assert killed, f"mutant survived ({name}): {proc.stdout[-800:]}"
