"""The walk of an LMDB database's B-tree, run as a script in a child process by :mod:`.guard`:
``python _walk.py PATH SUBDIR LMDB_DIR OPTIONS`` (SUBDIR ``1``: PATH is a folder holding
``data.mdb``; LMDB_DIR: where the parent found the ``lmdb`` package, searched after the usual
places; OPTIONS: ``lmdb.open``'s options as JSON, the reader's own, so the map is the same).

It does, once, every liblmdb call a reader of the database makes: one cursor pass over keys and
values (the key list, the labels, ``verify``) and a lookup of every key (``reader()``), touching
the last byte of every key and value (the bytes a reader copies). Where damaged pages trip
liblmdb's assertions (SIGABRT) or point past the end of the file (SIGBUS, SIGSEGV), this
process dies instead of the reader's.

It writes lines of JSON to stdout, unbuffered, so the parent knows how far it got when it dies:
``{"at": n}`` every 256 records, then ``{"done": n, "entries": e, "lookups_failed": m}`` (``e``:
the entry count liblmdb keeps; a walk that finds another number has met damaged pages), or ``{"error": msg,
"at": n, "key": hex}`` when liblmdb reports an error in the cursor pass (``{"error": msg, "open": true}``
when it cannot open the database). A lookup that liblmdb
answers with an error (rather than a crash) is counted, not fatal: the reader reports that
record when it is read.

It imports nothing but the standard library and ``lmdb`` (not stoker, whose import costs far
more than the walk of a small database), and it runs without core dumps.
"""

import json
import os
import sys

if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # the script's own folder holds stoker modules, not top-level ones

EVERY = 256


def _emit(obj: dict) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def main(path: str, subdir: bool, options: dict) -> int:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import lmdb

    try:
        env = lmdb.open(path, subdir=subdir, **options)
    except lmdb.Error as e:
        _emit({"error": str(e), "open": True})
        return 0
    n = failed = 0
    key = b""
    entries = int(env.stat()["entries"])
    txn = env.begin(buffers=True)
    look = env.begin(buffers=True)
    try:
        for k, v in txn.cursor().iternext(keys=True, values=True):
            key = bytes(k)
            if len(k):
                k[len(k) - 1]
            if len(v):
                v[len(v) - 1]
            try:
                w = look.get(key)
                if w is not None and len(w):
                    w[len(w) - 1]
            except lmdb.Error:
                failed += 1
                look.abort()  # an error leaves the transaction unusable
                look = env.begin(buffers=True)
            n += 1
            if n % EVERY == 0:
                _emit({"at": n})
    except lmdb.Error as e:
        _emit({"error": str(e), "at": n, "key": key.hex()})
        return 0
    finally:
        look.abort()
        txn.abort()
        env.close()
    _emit({"done": n, "entries": entries, "lookups_failed": failed})
    return 0


if __name__ == "__main__":
    if sys.argv[3] not in sys.path:
        sys.path.append(sys.argv[3])
    sys.exit(main(sys.argv[1], sys.argv[2] == "1", json.loads(sys.argv[4])))
