"""``stoker unpack FILE DIR``: write the images of a data set in any format stoker reads back to
``DIR/<class>/<key>.<ext>`` (through the format registry, ``stoker.formats.open``).

An insightface (MS1M) ``.rec`` gives its images only, one folder per identity (the images'
label); its header and identity records, which hold no image, go to ``DIR/identities.json``
(:data:`IDENTITY_TABLE`): the header record's contents and each identity's ``[start_key,
end_key)`` with the folder its images went to.

Class names come from the manifest, which is data from elsewhere: a name that could leave DIR
(``/``, ``\\``, ``..``, ``.``, NUL, an absolute path, an empty name) is refused before anything
is written, and each target is created with ``O_EXCL`` (never through an existing symlink).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from stoker._core.oscompat import OWN_FILE
from stoker.cli._formats import add_format_argument, run_on_set
from stoker.cli._remote import add_remote_arguments, remote_options
from stoker.formats import recordio

__all__ = [
    "DESCRIPTION",
    "HELP",
    "IDENTITY_TABLE",
    "add_arguments",
    "run",
    "safe_name",
    "unpack",
    "unpack_set",
]

#: the file beside an insightface set's unpacked images that keeps its identity table
IDENTITY_TABLE = recordio.IDENTITY_TABLE

#: samples read through one reader (a chunk, as the loader reads them)
_CHUNK = 1024

_EXT = {"JPEG": "jpg", "PNG": "png", "GIF": "gif", "BMP": "bmp", "WEBP": "webp", "TIFF": "tif"}


HELP = "write the images of a data set back to a class folder tree"
DESCRIPTION = f"""Write each record's image to DIR/<class>/<key>.<ext> (labels without a class
map become folders named by the label). An insightface .rec gives its images only, one folder
per identity, and its identity table in DIR/{IDENTITY_TABLE}. FILE may be the URL of a set's
manifest (s3://, gs://, az://, http(s)://): its shards are read through the shard cache."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a data set: manifest, data file or database folder")
    p.add_argument("dir", help="output folder (created if missing)")
    add_format_argument(p)
    p.add_argument("--overwrite", action="store_true", help="replace files that exist")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (no bar)")
    add_remote_arguments(p)


def safe_name(name: str, *, what: str = "name") -> str:
    """``name`` when it is one plain path component; otherwise :class:`StokerFormatError`."""
    from stoker._core.errors import StokerFormatError

    bad = (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or os.path.isabs(name)
    )
    if bad:
        raise StokerFormatError(
            f"refusing {what} {name!r}: it is not a single plain folder name and could write "
            "outside the output folder"
        )
    return name


def _folder(label: Any, names: list[str] | None) -> str:
    import numpy as np

    if np.ndim(label) > 0:
        return "multilabel"
    v = float(label)
    if names and v.is_integer() and 0 <= int(v) < len(names):
        return names[int(v)]
    return f"{int(v)}" if v.is_integer() else f"{v:g}"


def unpack(path: str, out_dir: str, **options: Any) -> int:
    """Write every image to ``out_dir``; returns the number written. The options are
    :func:`unpack_set`'s."""
    return int(unpack_set(path, out_dir, **options)["images"])


def unpack_set(
    path: str,
    out_dir: str,
    *,
    overwrite: bool = False,
    progress: bool | None = None,
    format: str | None = None,
    remote: Any = None,
) -> dict[str, Any]:
    """Write every image to ``out_dir`` (an insightface set's identity table too); returns
    the summary ``stoker unpack --json`` prints: ``file``, ``format``, ``dir``, ``images``,
    ``folders``, ``metadata_records`` and ``identity_table`` (the JSON file's path, or
    ``None``). ``path`` may be a set's manifest URL; ``remote``
    (:class:`~stoker.formats.remote.RemoteOptions`) says how to reach and cache it."""
    import numpy as np

    from stoker._core.progress import make_progress
    from stoker.formats import open_reader
    from stoker.storage.urls import redact

    shown = redact(os.fspath(path))
    # RecordIO checks each record against its .crc32c where there is one; an insightface
    # set's header and identity records are no samples
    r = open_reader(path, format=format, remote=remote)
    try:
        names = r.class_names
        if names:
            # path is the manifest the names come from, or the data file they lie beside
            for n in names:
                safe_name(n, what=f"class name in {shown}")
        table = r.identity_table()
        table_path = os.path.join(out_dir, IDENTITY_TABLE)
        if table is not None and not overwrite and os.path.lexists(table_path):
            raise FileExistsError(f"{table_path} exists; pass --overwrite to replace it")
        os.makedirs(out_dir, exist_ok=True)
        root = os.path.realpath(out_dir)
        made: set[str] = set()
        bar = make_progress(len(r), "unpack", enabled=progress)
        count = 0
        for start in range(0, len(r), _CHUNK):
            chunk = np.arange(start, min(start + _CHUNK, len(r)), dtype=np.int64)
            read = r.reader(chunk, ())
            for i in chunk.tolist():
                img, label, key, _ = read(i)
                _write(root, made, names, r.stored_bytes(img), label, int(key), overwrite)
                count += 1
                bar.update(1)
        bar.close()
        if table is not None:
            _add_folders(table, r.labels(), names)
            from stoker._core.atomic import write_bytes_atomic

            write_bytes_atomic(os.path.join(root, IDENTITY_TABLE), _table_json(table).encode())
        return {
            "file": shown,
            "format": r.format,
            "dir": os.fspath(out_dir),
            "images": count,
            "folders": len(made),
            "metadata_records": table["metadata_records"] if table is not None else 0,
            "identity_table": table_path if table is not None else None,
        }
    finally:
        r.close()


def _table_json(table: dict[str, Any]) -> str:
    """``table`` as JSON with one identity a line (MS1M has 85,742: about 7 MB)."""
    head = {k: v for k, v in table.items() if k != "identities"}
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    rows = ",\n  ".join(json.dumps(i, ensure_ascii=True) for i in table["identities"])
    return "{\n" + "\n".join(lines) + f'\n "identities": [\n  {rows}\n ]\n}}\n'


def _add_folders(table: dict[str, Any], labels: Any, names: list[str] | None) -> None:
    """Each identity's ``folder``: where its images went (their label's folder), or ``None``
    when it has none or they carry different labels."""
    import numpy as np

    labels = np.asarray(labels)
    first = table["image_keys"][0]  # image key k is sample k - first
    for ident in table["identities"]:
        lab = labels[ident["start_key"] - first : ident["end_key"] - first]
        one = lab.ndim == 1 and lab.size > 0 and bool(np.all(lab == lab[0]))
        ident["folder"] = _folder(lab[0], names) if one else None


def _write(
    root: str,
    made: set[str],
    names: list[str] | None,
    img: Any,
    label: Any,
    key: int,
    overwrite: bool,
) -> None:
    """Write one image to ``root/<class>/<key>.<ext>``, never through a symlink."""
    from stoker.pack.images import sniff_format

    folder = safe_name(_folder(label, names), what=f"folder for key {key}")
    target_dir = os.path.join(root, folder)
    if folder not in made:
        os.makedirs(target_dir, exist_ok=True)
        real = os.path.realpath(target_dir)
        if os.path.dirname(real) != root:
            raise OSError(f"{target_dir} leads outside {root} (a symlink?); refusing")
        made.add(folder)
    ext = _EXT.get(sniff_format(bytes(img[:12])) or "", "bin")
    target = os.path.join(target_dir, f"{key}.{ext}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | OWN_FILE
    if overwrite and os.path.lexists(target):
        os.unlink(target)
    fd = os.open(target, flags, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(img)


def run(args: argparse.Namespace) -> int:
    return run_on_set("unpack", args, lambda name: _run(args, name))


def _run(args: argparse.Namespace, name: str) -> int:
    from stoker.cli._errors import folder_problem, refuse

    problem = folder_problem(args.dir, "DIR")
    if problem is not None:
        return refuse("unpack", problem)
    summary = unpack_set(
        args.file,
        args.dir,
        overwrite=args.overwrite,
        progress=False if args.quiet or args.json else None,
        format=name,
        remote=remote_options(args),
    )
    if args.json:
        print(json.dumps(summary, indent=1, ensure_ascii=True))
    elif not args.quiet:
        line = f"wrote {summary['images']} images in {summary['folders']} folders under {args.dir}"
        if summary["identity_table"] is not None:
            line += (
                f"; {summary['metadata_records']} metadata records (insightface header and "
                f"identities) kept in {summary['identity_table']}"
            )
        print(line)
    return 0
