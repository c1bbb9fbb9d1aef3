"""Small sets written through the format registry, for tests that compare the formats: real
JPEGs of a few sizes (blocky noise, so each encodes differently), written in shards by each
format's own writer and manifest, as ``stoker pack`` writes them."""

from __future__ import annotations

import itertools
import os

import numpy as np
import simplejpeg

from stoker._core.schema import Schema
from stoker.formats import registry


def jpegs(
    n: int, *, seed: int, classes: int, h0: int, w0: int, hmod: int
) -> tuple[list[bytes], list[int]]:
    """``n`` JPEGs of ``(h0 + 4 * (i % hmod), w0 + 6 * (i % 3))`` pixels and their labels."""
    rng = np.random.default_rng(seed)
    blobs, labels = [], []
    for i in range(n):
        h, w = h0 + 4 * (i % hmod), w0 + 6 * (i % 3)
        base = rng.integers(0, 256, (h // 4 + 1, w // 4 + 1, 3), dtype=np.uint8)
        img = np.ascontiguousarray(np.repeat(np.repeat(base, 4, 0), 4, 1)[:h, :w])
        blobs.append(simplejpeg.encode_jpeg(img, quality=90))
        labels.append(int(rng.integers(0, classes)))
    return blobs, labels


def write_set(
    name: str, prefix: str, blobs: list[bytes], labels: list[int], *, shard: int, classes: int
) -> str:
    """The set in format ``name`` under ``prefix`` (shards of ``shard`` records, per-record
    checksums); returns its manifest."""
    fmt = registry.get(name)
    open_writer, write_manifest = fmt.load("writer"), fmt.load("manifest")
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    schema = Schema.classification((), "int64")
    entries = []
    for j, start in enumerate(range(0, len(blobs), shard)):
        w = open_writer(prefix, j, schema=schema, checksums=True)
        for k in range(start, min(start + shard, len(blobs))):
            w.write(k, blobs[k], labels[k], {})
        entries.append(w.commit())
    manifest = prefix + ".stoker.json"
    names = {f"c{c}": c for c in range(classes)}
    write_manifest(manifest, entries, classes=names, schema=schema, pack=None, rejects=None)
    return manifest


def pairwise(cells: list[tuple]) -> list[tuple]:
    """A few of ``cells`` that together hold every pair of values of any two axes that some
    cell holds (greedy, deterministic): a test matrix's default sample."""

    def pairs(c: tuple) -> set:
        return {(a, c[a], b, c[b]) for a, b in itertools.combinations(range(len(c)), 2)}

    want = set().union(*(pairs(c) for c in cells))
    chosen: list[tuple] = []
    while want:
        best = max(cells, key=lambda c: len(pairs(c) & want))
        chosen.append(best)
        want -= pairs(best)
    return chosen
