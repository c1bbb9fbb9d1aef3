"""The examples that carry fields run as a user runs them (a fresh interpreter, real worker
processes) and show what they claim: the detection example's boxes stay on their rectangles
through crops and flips and its loss falls; the OCR example trains on text from the batch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(240)


def run_example(name: str, *args: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_detection_example_boxes_follow_the_image_and_the_loss_falls():
    out = run_example("detection.py", "--images", "128", "--epochs", "3", "--workers", "2")
    assert "packed 128 images with their boxes and classes" in out
    epochs = re.findall(
        r"epoch \d+: loss ([\d.]+), boxes per image \[([\d, ]+)\], boxes on their colour ([\d.]+)%",
        out,
    )
    assert len(epochs) == 3, out
    losses = [float(loss) for loss, _, _ in epochs]
    assert losses[-1] < 0.8 * losses[0], out
    for _, counts, agree in epochs:
        # a variable number per image, none included (an empty target is valid)
        assert {0, 1, 2, 3} <= {int(c) for c in counts.split(",")}, out
        assert float(agree) >= 98.0, out  # every crop and flip moved the boxes with the pixels


@pytest.mark.slow  # 12 s; the detection example keeps an example training in the default run
def test_ocr_example_trains_on_the_text_carried_in_the_batch():
    source = (ROOT / "examples" / "ocr_length_buckets.py").read_text()
    assert 'batch["text"]' in source and "batch.indices" not in source
    out = run_example("ocr_length_buckets.py", "--lines", "192", "--epochs", "3")
    assert "after normalize_punctuation:         {}" in out
    losses = [float(x) for x in re.findall(r"CTC loss ([\d.]+)", out)]
    assert len(losses) == 3 and losses[-1] < losses[0], out
    widths = re.findall(r"batch widths \[([\d, ]+)\]", out)
    assert len(widths[0].split(",")) > 1, out  # one width per batch, several widths
