"""``stoker inspect FILE``: what a data set holds, in any format stoker reads (records,
classes, labels, image sizes, and the fields of a set with them), through the format registry
(``stoker.formats.open``); what only one format has (RecordIO's shards, bytes per record and
insightface layout) comes from its reader's ``summary()``.

Exits 1 when an image of the sample has no readable image header (``stoker verify`` names
each). An insightface set's header and identity records are counted as metadata records, not
sampled as images.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np

from stoker.cli._formats import add_format_argument, run_on_set
from stoker.cli._remote import add_remote_arguments, remote_options
from stoker.formats.report import spread

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "inspect_records", "inspect_set", "run"]


HELP = "show records, classes, label and image-size statistics of a data set"
DESCRIPTION = """Summarise FILE (a .stoker.json manifest, a .rec/.idx, a TFRecord file, a
WebDataset .tar, an LMDB folder: any format stoker reads): records, shards, bytes, classes,
label counts, and image formats and sizes read from the image headers of a sample of records.
Exit 1 when an image header of the sample cannot be read. FILE may be the URL of a set's
manifest (RecordIO, TFRecord or WebDataset; s3://, gs://, az://, http(s)://): its shards are
read through the shard cache."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a data set: manifest, data file or database folder")
    add_format_argument(p)
    p.add_argument(
        "--sample",
        type=int,
        default=2000,
        metavar="N",
        help="records whose image headers are read (default 2000; 0 = all)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    add_remote_arguments(p)


def _labels(reader: Any, out: dict[str, Any]) -> None:
    """The label statistics (and records per class) of ``reader`` into ``out``."""
    names = reader.class_names
    out["classes"] = len(names) if names is not None else None
    try:
        labels = np.asarray(reader.labels())
    except ValueError as e:
        out["labels"] = {"error": str(e)}
        return
    if labels.ndim == 1 and labels.size:
        values, counts = np.unique(labels, return_counts=True)
        out["labels"] = {
            "kind": "scalar",
            "distinct": int(values.size),
            "min": float(values.min()),
            "max": float(values.max()),
            "per_label": spread(counts),
        }
        if names:
            per_class = {name: 0 for name in names}
            for v, c in zip(values.tolist(), counts.tolist()):
                if float(v).is_integer() and 0 <= int(v) < len(names):
                    per_class[names[int(v)]] = int(c)
            out["per_class"] = per_class
    elif labels.ndim == 2:
        out["labels"] = {"kind": "multi", "per_record": int(labels.shape[1])}


def _images(reader: Any, sample: int) -> dict[str, Any]:
    """Formats and sizes from the image headers of ``sample`` evenly spaced samples."""
    from stoker.codecs import image_size
    from stoker.pack.images import sniff_format

    m = len(reader)
    take = np.unique(
        np.arange(m)
        if sample <= 0 or sample >= m
        else np.linspace(0, m - 1, sample).astype(np.int64)
    )
    hs: list[int] = []
    ws: list[int] = []
    formats: dict[str, int] = {}
    bad = 0
    read, as_bytes = reader.reader(take, ()), reader.stored_bytes
    for i in take.tolist():
        try:
            img = as_bytes(read(i)[0])  # a decoded array: as the PNG convert would write
            h, w = image_size(img)
        except Exception:  # noqa: BLE001 - counted; `stoker verify` names the problem
            bad += 1
            continue
        fmt = sniff_format(bytes(img[:12])) or "other"
        formats[fmt] = formats.get(fmt, 0) + 1
        hs.append(h)
        ws.append(w)
    return {
        "sampled": int(take.size),
        "formats": formats,
        "height": spread(np.asarray(hs)),
        "width": spread(np.asarray(ws)),
        "unreadable_headers": bad,
    }


def inspect_set(
    path: str | os.PathLike[str],
    *,
    sample: int = 2000,
    format: str | None = None,
    remote: Any = None,
) -> dict:
    """A JSON-safe summary of a data set in any format (see ``stoker inspect --help``).
    ``path`` may be a set's manifest URL; ``remote``
    (:class:`~stoker.formats.remote.RemoteOptions`) says how to reach and cache it."""
    from stoker.formats import open_reader
    from stoker.formats.remote import remote_url
    from stoker.storage.urls import redact

    reader = open_reader(path, format=format, remote=remote)
    try:
        files = reader.files()
        out: dict[str, Any] = {
            "file": redact(os.fspath(path)),
            "format": reader.format,
            "records": len(reader),
            "shards": len(files),
            "bytes": int(sum(os.path.getsize(f) for f in files if os.path.isfile(f))),
        }
        out.update(reader.summary())
        if remote_url(os.fspath(path)) is not None and "rec_bytes" in out:
            out["bytes"] = out["rec_bytes"]  # the shards' sizes, as a local set's files give
        _labels(reader, out)
        out["images"] = _images(reader, sample)
        schema = reader.schema
        if schema.extra:
            out["schema"] = schema.to_json()["fields"]
        return out
    finally:
        reader.close()


#: The name this summary had when RecordIO was the only format.
inspect_records = inspect_set


def _fmt_stats(s: dict[str, float], unit: str = "") -> str:
    if not s:
        return "-"
    return (
        f"min {s['min']:g}{unit}, median {s['median']:g}{unit}, mean {s['mean']:g}{unit}, "
        f"max {s['max']:g}{unit}"
    )


def run(args: argparse.Namespace) -> int:
    """Print the summary; exit 1 when an image header in the sample could not be read."""
    return run_on_set("inspect", args, lambda name: _run(args, name))


def _run(args: argparse.Namespace, name: str) -> int:
    info = inspect_set(args.file, sample=args.sample, format=name, remote=remote_options(args))
    status = 1 if info["images"]["unreadable_headers"] else 0
    if args.json:
        print(json.dumps(info, indent=1, ensure_ascii=True))
        return status
    mb = info.get("rec_bytes", info["bytes"]) / 1e6
    print(f"file:          {info['file']} ({info['format']})")
    print(f"records:       {info['records']} in {info['shards']} shard(s), {mb:.1f} MB")
    if "bytes_per_record" in info:
        print(f"bytes/record:  {_fmt_stats(info['bytes_per_record'])}")
    if info.get("metadata_records") is not None:
        print(f"metadata records: {info['metadata_records']} ({_metadata(info)}; not images)")
    lab = info.get("labels") or {}
    if lab.get("kind") == "scalar":
        print(
            f"labels:        {lab['distinct']} distinct ({lab['min']:g}..{lab['max']:g}); "
            f"records per label: {_fmt_stats(lab['per_label'])}"
        )
    elif lab.get("kind") == "multi":
        print(f"labels:        {lab['per_record']} per record")
    elif "error" in lab:
        print(f"labels:        {lab['error']}")
    if info.get("classes") is not None:
        per = info.get("per_class") or {}
        empty = [k for k, v in per.items() if v == 0]
        line = f"classes:       {info['classes']}"
        if empty:
            line += f" ({len(empty)} without records: {', '.join(map(repr, empty[:5]))})"
        print(line)
    im = info["images"]
    fmts = ", ".join(f"{k} {v}" for k, v in sorted(im["formats"].items())) or "-"
    print(f"images:        {im['sampled']} headers read: {fmts}")
    print(f"  height:      {_fmt_stats(im['height'], ' px')}")
    print(f"  width:       {_fmt_stats(im['width'], ' px')}")
    if im["unreadable_headers"]:
        print(
            f"  unreadable:  {im['unreadable_headers']} of the sampled image records "
            "(run `stoker verify --decode` to name them)"
        )
    if "identities" in info:
        print(f"identities:    {info['identities']} (insightface layout)")
    if info.get("rejects"):
        print(f"rejected at pack time: {info['rejects']}")
    if info.get("schema"):
        print("fields:")
        for f in info["schema"]:
            print(f"  {_describe_field(f)}")
    return status


def _metadata(info: dict) -> str:
    """``insightface: 1 header record, 85742 identity records``: what the metadata records are."""
    kinds = info.get("metadata")
    if not kinds:
        return "records that hold no image"
    parts = [_count(kinds["header"], "header record"), _count(kinds["identity"], "identity record")]
    if kinds.get("other"):
        parts.append(_count(kinds["other"], "other record"))
    return "insightface: " + ", ".join(parts)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _describe_field(f: dict) -> str:
    """One line of a schema field: ``boxes        ragged float32 (n, 4), boxes, max 12``."""
    kind = f["kind"]
    parts = [kind]
    if kind in ("numeric", "ragged"):
        dims = [str(d) for d in f.get("shape", [])]
        shape = ", ".join((["n"] if kind == "ragged" else []) + dims)
        parts.append(f"{f['dtype']} ({shape}{',' if len(dims) + (kind == 'ragged') == 1 else ''})")
    if f.get("header"):
        parts.append("the label")
    if f.get("geometry"):
        parts.append(f"geometry {f['geometry']}")
    if f.get("follows"):
        parts.append(f"follows {f['follows']}")
    if f.get("max_len") is not None:
        unit = "rows" if kind == "ragged" else "bytes"
        parts.append(f"at most {f['max_len']} {unit}")
    return f"{f['name']:<14} " + ", ".join(parts)
