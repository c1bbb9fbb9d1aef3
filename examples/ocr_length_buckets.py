"""OCR with length buckets: text-line images of varying length, one width per batch.

The recipe of seed 001, end to end on CPU in well under a minute:

1. make synthetic text lines (digits and a few punctuation marks, 1 to 12 characters), drawn on
   the spot with ``cv2.putText``; their labels mix ASCII and full-width punctuation, as scraped
   labels do;
2. ``label_stats`` finds the marks written two ways; ``normalize_punctuation`` keeps one form;
3. a JSONL listing names each line image and its (normalised) text; ``stoker.pack`` stores the
   text inside the records, so it travels with its image: ``batch["text"]``;
4. ``LengthBuckets`` groups lines of similar label length into batches; ``ProportionalWidth``
   gives each batch a width from its longest label; the loader pads (or squeezes) every line of
   a batch to that width, in worker processes;
5. a tiny convolutional CTC model trains for a few epochs; the loss falls.

Run: ``python examples/ocr_length_buckets.py [--epochs 4] [--lines 384] [--workers 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import cv2
import numpy as np
import torch
from torch import nn

import stoker
from stoker import ArraySpec
from stoker.sampling import LengthBuckets, ProportionalWidth
from stoker.train import label_stats, normalize_punctuation, scale_lr
from stoker.transforms import as_transform

HEIGHT = 32
GLYPHS = "0123456789,.:-"
VOCAB = {ch: i + 1 for i, ch in enumerate(GLYPHS)}  # 0 is the CTC blank
# how a careless labeller wrote the punctuation: sometimes ASCII, sometimes full-width
FULLWIDTH = {",": "，", ".": "．", ":": "：", "-": "－"}


def render(text: str, rng: np.random.Generator) -> np.ndarray:
    """A 32-pixel-high line of ``text``, about 14 pixels per character, light on dark."""
    font, scale = cv2.FONT_HERSHEY_SIMPLEX, 0.6
    (w, _h), _ = cv2.getTextSize(text, font, scale, 1)
    img = np.full((HEIGHT, w + 8, 3), int(rng.integers(0, 40)), np.uint8)
    cv2.putText(
        img, text, (4, 22 + int(rng.integers(-2, 3))), font, scale, (235, 235, 235), 1, cv2.LINE_AA
    )
    return img


def to_height(img: np.ndarray) -> np.ndarray:
    """Scale a line to HEIGHT pixels, keeping its aspect ratio (the width stays open)."""
    h, w = img.shape[:2]
    if h == HEIGHT:
        return img
    return cv2.resize(img, (max(1, round(w * HEIGHT / h)), HEIGHT), interpolation=cv2.INTER_AREA)


def make_lines(root: str, n: int, seed: int) -> list[str]:
    """Write ``n`` line images to ``root/lines/`` and return their (raw) labels in file order."""
    rng = np.random.default_rng(seed)
    folder = os.path.join(root, "lines")
    os.makedirs(folder, exist_ok=True)
    labels = []
    for i in range(n):
        length = int(rng.integers(1, 13))
        text = "".join(rng.choice(list(GLYPHS), size=length, p=_glyph_p()))
        cv2.imwrite(os.path.join(folder, f"{i:06d}.png"), render(text, rng))
        raw = "".join(FULLWIDTH[c] if c in FULLWIDTH and rng.random() < 0.5 else c for c in text)
        labels.append(raw)
    return labels


def write_listing(root: str, texts: list[str]) -> str:
    """``root/lines.jsonl``: one row per line image, its text beside it."""
    path = os.path.join(root, "lines.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"image": f"lines/{i:06d}.png", "text": text}) + "\n")
    return path


def _glyph_p() -> np.ndarray:
    p = np.ones(len(GLYPHS))
    p[10:] = 0.25  # punctuation is rarer than digits
    return p / p.sum()


class TinyCTC(nn.Module):
    """Conv stack: height 32 -> 1, width / 4 -> T time steps, then per-step class scores."""

    def __init__(self, classes: int) -> None:
        super().__init__()

        def block(i: int, o: int, pool: tuple[int, int]) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(pool)
            )

        self.features = nn.Sequential(
            block(1, 16, (2, 2)),
            block(16, 32, (2, 2)),
            block(32, 64, (2, 1)),
            block(64, 64, (4, 1)),
        )
        self.head = nn.Conv1d(64, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 1, 32, W) -> (T, B, C)
        f = self.features(x).squeeze(2)
        return self.head(f).permute(2, 0, 1).log_softmax(-1)


def greedy(log_probs: torch.Tensor) -> list[str]:
    out = []
    inv = {v: k for k, v in VOCAB.items()}
    for seq in log_probs.argmax(-1).T.tolist():
        chars, prev = [], 0
        for s in seq:
            if s != prev and s != 0:
                chars.append(inv[s])
            prev = s
        out.append("".join(chars))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=384)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()

    with tempfile.TemporaryDirectory() as root:
        raw = make_lines(root, args.lines, args.seed)
        before = label_stats(raw)
        texts = [normalize_punctuation(t) for t in raw]
        after = label_stats(texts)
        print(f"{len(texts)} lines, lengths {before.min_length}..{before.max_length}")
        print(f"punctuation written two ways before: {before.punctuation_variants}")
        print(f"after normalize_punctuation:         {after.punctuation_variants}")
        report = stoker.pack(
            write_listing(root, texts), os.path.join(root, "ocr"), workers=1, progress=False
        )

        lengths = [len(t) for t in texts]
        width_rule = ProportionalWidth(14, multiple=8, min_width=32)
        sampler = LengthBuckets(
            lengths,
            batch_size=args.batch_size,
            bucket_bounds=[3, 6, 9, 12],
            widths=width_rule,
            seed=args.seed,
            dataset_size=len(texts),
        )
        rep = sampler.report()
        print(
            f"buckets <= {rep['bounds']}: {rep['bucket_sizes']} lines; {rep['batches']} batches, "
            f"{rep['merged']} lines in merged tail batches, padding {rep['padding']}"
        )

        model = TinyCTC(len(VOCAB) + 1)
        # the usual reference: lr 1e-3 at batch 32 for Adam; sqrt scaling to our batch
        lr = scale_lr(1e-3, args.batch_size, base_batch_size=32, rule="sqrt") * 3
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        ctc = nn.CTCLoss(blank=0, zero_infinity=True)
        transform = as_transform(to_height, output=ArraySpec((HEIGHT, None, 3), "uint8"))

        with stoker.Loader(
            report.manifest,
            batch_size=args.batch_size,
            sampler=sampler,
            transforms=transform,
            fields=["text"],
            workers=args.workers,
        ) as loader:
            for epoch in range(args.epochs):
                losses, widths, correct, seen = [], set(), 0, 0
                for batch in loader:  # the epoch advances by itself; the sampler follows it
                    x = torch.from_numpy(batch.images).float().mean(-1, keepdim=True)
                    x = x.permute(0, 3, 1, 2) / 255.0
                    widths.add(int(x.shape[-1]))
                    batch_texts = batch["text"]  # list of str, read with the images
                    targets = torch.tensor([VOCAB[c] for t in batch_texts for c in t])
                    target_lengths = torch.tensor([len(t) for t in batch_texts])
                    log_probs = model(x)
                    input_lengths = torch.full(
                        (len(batch_texts),), log_probs.shape[0], dtype=torch.long
                    )
                    loss = ctc(log_probs, targets, input_lengths, target_lengths)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
                    correct += sum(p == t for p, t in zip(greedy(log_probs.detach()), batch_texts))
                    seen += len(batch_texts)
                print(
                    f"epoch {epoch}: CTC loss {np.mean(losses):.3f}, exact lines {correct}/{seen}, "
                    f"batch widths {sorted(widths)}"
                )
    print(f"done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
