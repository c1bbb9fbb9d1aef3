"""F-02's child process: seeded random mutations of a small valid record set, each read back.

``python _fuzz_child.py SEED FIRST COUNT WORKDIR``: builds the base set of
``scripts/make_fault_corpus.py`` in WORKDIR, then for each case ``FIRST .. FIRST+COUNT-1``
mutates one of ``.rec``/``.idx``/``.crc32c``/``.stoker.json`` (1 to 4 edits: bit flips, random
bytes, special words at aligned offsets, cuts, inserted, deleted and duplicated spans), opens
it with or without checksums and with or without its manifest, reads every record and its
labels, and runs ``verify_records``. Before each case its number goes to WORKDIR/progress (so
the parent can name the case a crash killed); the result is one JSON line on stdout.

Each case runs under a 2 s CPU-time alarm (``ITIMER_PROF``: independent of how loaded the
machine is; a blocked read is the parent's wall-clock timeout's job) and its peak RSS growth
(``ru_maxrss``) is measured.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import resource
import shutil
import signal
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASE_CPU_S = 2.0
ALLOC_LIMIT_KB = 64 * 1024
SPECIAL = [
    struct.pack("<I", 0xCED7230A),
    struct.pack("<I", 0x1FFFFFFF),
    struct.pack("<I", 0x3FFFFFFF),
    struct.pack("<I", 0x20000010),
    struct.pack("<I", 0x60000000),
    struct.pack("<I", 1 << 31),
    b"\xff\xff\xff\xff",
    b"\x00\x00\x00\x00",
]


class Hang(Exception):
    pass


def _on_alarm(signum, frame):  # noqa: ARG001
    raise Hang()


def _load_corpus():
    spec = importlib.util.spec_from_file_location(
        "make_fault_corpus", HERE.parents[1] / "scripts" / "make_fault_corpus.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_fault_corpus"] = mod
    spec.loader.exec_module(mod)
    return mod


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        n = len(b)
        if n == 0:
            b += bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 8)))
            continue
        i = rng.randrange(n)
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i] = rng.randrange(256)
        elif op == 2:
            j = (i & ~3) if n >= 4 else 0
            word = rng.choice(SPECIAL)
            b[j : j + 4] = word[: max(0, min(4, n - j))]
        elif op == 3:
            del b[rng.randrange(n) :]
        elif op == 4:
            b[i:i] = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 16)))
        elif op == 5:
            del b[i : i + rng.randint(1, 64)]
        else:
            j = rng.randrange(n)
            b[i:i] = b[j : j + rng.randint(1, 64)]
    return bytes(b)


def run_case(base: Path, work: Path, payloads: list[bytes], rng: random.Random) -> str:
    """One mutation: ``"ok"``, ``"format-error"``, ``"wrong"`` or ``"other: ..."``."""
    from stoker._core.errors import StokerFormatError
    from stoker.formats.recordio import unpack_header, verify_records
    from stoker.formats.recordio.seam import RecordIOReader

    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    suffix = rng.choices([".rec", ".idx", ".crc32c", ".stoker.json"], [50, 25, 10, 15])[0]
    target = work / f"ds{suffix}"
    target.write_bytes(mutate(target.read_bytes(), rng))
    if suffix != ".stoker.json" and rng.random() < 0.5:
        (work / "ds.stoker.json").unlink()
    checksums = rng.random() < 0.5
    path = work / ("ds.stoker.json" if rng.random() < 0.3 else "ds.rec")
    if not path.exists():
        path = work / "ds.rec"
    outcome = "ok"
    try:
        r = RecordIOReader(path, checksums=checksums)
        try:
            for i in range(len(r)):
                got = bytes(r.read(i)[0])
                if checksums and (
                    len(r) != len(payloads) or got != bytes(unpack_header(payloads[i])[1])
                ):
                    outcome = "wrong"
            r.labels()
            r.identity_table()
        finally:
            r.close()
    except StokerFormatError:
        outcome = "format-error"
    except Hang:
        raise
    except Exception as e:  # noqa: BLE001 - the finding
        return f"other: {type(e).__name__}: {e}"[:300]
    try:
        verify_records(path, checksums=True, progress=False)
    except StokerFormatError:
        pass
    except Hang:
        raise
    except Exception as e:  # noqa: BLE001
        return f"other (verify): {type(e).__name__}: {e}"[:300]
    return outcome


def main() -> int:
    seed, first, count, workdir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    corpus = _load_corpus()
    root = Path(workdir)
    base = root / "base"
    payloads = corpus.base_payloads()
    corpus.write_set(base, payloads)
    signal.signal(signal.SIGPROF, _on_alarm)
    counts: dict[str, int] = {}
    bad: list[str] = []
    progress = open(root / "progress", "w")  # noqa: SIM115
    for n in range(first, first + count):
        progress.seek(0)
        progress.write(f"{n:>12}\n")
        progress.flush()
        rng = random.Random(seed * 1_000_003 + n)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        signal.setitimer(signal.ITIMER_PROF, CASE_CPU_S)
        try:
            outcome = run_case(base, root / "case", payloads, rng)
        except Hang:
            outcome = "hang"
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        if grew > ALLOC_LIMIT_KB:
            outcome = f"alloc: ru_maxrss grew {grew} KB"
        kind = outcome.split(":")[0]
        counts[kind] = counts.get(kind, 0) + 1
        if kind not in ("ok", "format-error"):
            bad.append(f"case {n}: {outcome}")
    progress.close()
    print(json.dumps({"counts": counts, "bad": bad[:20], "cases": count}))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("STOKER_NO_PROGRESS", "1")
    sys.exit(main())
