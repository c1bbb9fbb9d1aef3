"""A manifest of thousands of shards: shards open lazily and at most ``MAX_OPEN_SHARDS``
stay open per process, so a full read by a loader with 8 workers fits a small
``ulimit -n`` and the memory maps stay bounded (``vm.max_map_count``)."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import textwrap
import time

import crc32c
import numpy as np
import pytest
from PIL import Image

from stoker.formats.recordio import IRHeader, frame_record, make_manifest, pack_header
from stoker.formats.shards import MAX_OPEN_SHARDS

PER_SHARD = 2


def _jpeg() -> bytes:
    arr = np.random.default_rng(1).integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
    b = io.BytesIO()
    Image.fromarray(arr).save(b, "JPEG")
    return b.getvalue()


def _many_shards(root, shards: int) -> str:
    """``shards`` shards of ``PER_SHARD`` JPEG records each (with ``.crc32c``), written
    directly (no fsync per file), dated an hour back so the index caches get written."""
    img = _jpeg()
    old = time.time() - 3600
    entries = []
    for j in range(shards):
        name = f"s-{j:06d}"
        rec, idx, crcs, off = bytearray(), [], bytearray(), 0
        for k in range(PER_SHARD):
            p = pack_header(IRHeader(0, float((j + k) % 5), k, 0), img)
            framed = frame_record(p)
            idx.append(f"{k}\t{off}\n")
            rec += framed
            off += len(framed)
            crcs += crc32c.crc32c(p).to_bytes(4, "little")
        idx_bytes = "".join(idx).encode()
        for ext, data in (("rec", rec), ("idx", idx_bytes), ("crc32c", crcs)):
            path = os.path.join(root, f"{name}.{ext}")
            with open(path, "wb") as f:
                f.write(data)
            os.utime(path, (old, old))
        entries.append(
            {
                "files": {"data": f"{name}.rec", "index": f"{name}.idx", "crc": f"{name}.crc32c"},
                "records": PER_SHARD,
                "bytes": len(rec),
                "checksums": {"index.sha256": hashlib.sha256(idx_bytes).hexdigest()},
            }
        )
    mpath = os.path.join(root, "many.stoker.json")
    import json

    with open(mpath, "w") as f:
        json.dump(make_manifest(entries), f)
    return mpath


_CHILD = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    def maps():
        with open("/proc/self/maps") as f:
            return sum(1 for line in f if line.rstrip().endswith((".rec", ".stkidx")))

    def main():
        from stoker import Loader
        from stoker.formats.recordio.seam import RecordIOReader
        from stoker.transforms import CenterCrop

        path, n, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
        most = 0
        with RecordIOReader(path) as r:
            assert len(r) == n
            for i in range(n):
                assert len(r.read(i)[0]) > 0
                if i % 97 == 0:
                    most = max(most, maps())
            most = max(most, maps())
        seen = 0
        with Loader(path, batch_size=64, workers=workers, transforms=CenterCrop(4),
                    shuffle=True, seed=0) as ld:
            for b in ld:
                seen += len(b.keys)
                most = max(most, maps())
            assert seen == n, seen
        print("MAPS", most)

    if __name__ == "__main__":
        main()
    """
)


def _read_all_under_a_small_ulimit(tmp_path, shards: int, workers: int) -> int:
    mpath = _many_shards(str(tmp_path), shards)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    done = subprocess.run(
        [sys.executable, str(script), mpath, str(shards * PER_SHARD), str(workers)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return int(done.stdout.split("MAPS")[1])


def test_eight_hundred_shards_read_fully_with_256_file_descriptors(tmp_path):
    most = _read_all_under_a_small_ulimit(tmp_path, 800, 8)  # 2,400 files: 9x the limit
    assert 0 < most <= 2 * MAX_OPEN_SHARDS + 4  # a .rec and an index cache per open shard


@pytest.mark.slow
@pytest.mark.timeout(900)  # writing 300,000 files and reading 200,000 records: minutes, not 180 s
def test_a_hundred_thousand_shards_read_fully_with_256_file_descriptors(tmp_path):
    most = _read_all_under_a_small_ulimit(tmp_path, 100_000, 8)
    assert 0 < most <= 2 * MAX_OPEN_SHARDS + 4
