"""``stoker inspect FILE``: what a record file holds (records, classes, labels, image sizes,
and the fields of a set packed with them).

Exits 1 when an image record of the sample has no readable image header (``stoker verify``
names each). An insightface set's header and identity records are counted as metadata
records, not sampled as images.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from stoker.formats.recordio import Records

__all__ = ["add_parser", "inspect_records", "run"]


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help="show records, classes, label and image-size statistics of a .rec",
        description=(
            "Summarise FILE (.rec, .idx or NAME.stoker.json): records, shards, bytes per record, "
            "classes, label counts, and image formats and sizes read from the image headers of a "
            "sample of records. Exit 1 when an image header of the sample cannot be read."
        ),
    )
    p.add_argument("file", help=".rec, .idx or .stoker.json")
    p.add_argument(
        "--sample",
        type=int,
        default=2000,
        metavar="N",
        help="records whose image headers are read (default 2000; 0 = all)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)
    return p


def _stats(a: np.ndarray) -> dict[str, float]:
    if a.size == 0:
        return {}
    return {
        "min": float(a.min()),
        "median": float(np.median(a)),
        "mean": round(float(a.mean()), 2),
        "max": float(a.max()),
    }


def _record_sizes(r: Records) -> np.ndarray:
    parts = []
    for s in r.shards:
        offs = np.asarray(s.offsets, dtype=np.int64)
        if offs.size == 0:
            continue
        order = np.sort(offs)
        ends = np.append(order[1:], s.size)
        parts.append(ends - order)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def inspect_records(path: str | os.PathLike[str], *, sample: int = 2000) -> dict:
    """A JSON-safe summary of a record file (see ``stoker inspect --help``)."""
    from stoker.codecs import image_size
    from stoker.formats.recordio import open_records
    from stoker.pack.images import sniff_format

    r = open_records(path)
    try:
        n = len(r)
        shards = r.shards
        sizes = _record_sizes(r)
        out: dict[str, Any] = {
            "file": os.fspath(path),
            "records": n,
            "shards": len(shards),
            "rec_bytes": int(sum(s.size for s in shards)),
            "bytes_per_record": _stats(sizes),
        }
        names = r.class_names
        out["classes"] = len(names) if names is not None else None
        images = r.images()  # an insightface set's header and identity records are no images
        if images is not r:
            out["metadata_records"] = n - len(images)
        try:
            labels = images.labels()
        except ValueError as e:
            labels = None
            out["labels"] = {"error": str(e)}
        if labels is not None and labels.ndim == 1 and labels.size:
            values, counts = np.unique(labels, return_counts=True)
            out["labels"] = {
                "kind": "scalar",
                "distinct": int(values.size),
                "min": float(values.min()),
                "max": float(values.max()),
                "per_label": _stats(counts),
            }
            if names:
                per_class = {name: 0 for name in names}
                for v, c in zip(values.tolist(), counts.tolist()):
                    if float(v).is_integer() and 0 <= int(v) < len(names):
                        per_class[names[int(v)]] = int(c)
                out["per_class"] = per_class
        elif labels is not None and labels.ndim == 2:
            out["labels"] = {"kind": "multi", "per_record": int(labels.shape[1])}
        m = len(images)
        take = (
            np.arange(m)
            if sample <= 0 or sample >= m
            else np.linspace(0, m - 1, sample).astype(np.int64)
        )
        hs: list[int] = []
        ws: list[int] = []
        formats: dict[str, int] = {}
        bad = 0
        for i in np.unique(take).tolist():
            try:
                _, img = images.read_header(i)
                h, w = image_size(img)
            except Exception:  # noqa: BLE001 - counted; `stoker verify` names the problem
                bad += 1
                continue
            fmt = sniff_format(bytes(img[:12])) or "other"
            formats[fmt] = formats.get(fmt, 0) + 1
            hs.append(h)
            ws.append(w)
        out["images"] = {
            "sampled": int(np.unique(take).size),
            "formats": formats,
            "height": _stats(np.asarray(hs)),
            "width": _stats(np.asarray(ws)),
            "unreadable_headers": bad,
        }
        if r.identity_ranges is not None:
            out["identities"] = int(len(r.identity_ranges))
        if r.manifest:
            out["rejects"] = r.manifest.get("rejects", {}).get("count")
            if "schema" in r.manifest:
                out["schema"] = r.schema.to_json()["fields"]
        return out
    finally:
        r.close()


def _fmt_stats(s: dict[str, float], unit: str = "") -> str:
    if not s:
        return "-"
    return (
        f"min {s['min']:g}{unit}, median {s['median']:g}{unit}, mean {s['mean']:g}{unit}, "
        f"max {s['max']:g}{unit}"
    )


def run(args: argparse.Namespace) -> int:
    """Print the summary; exit 1 when an image header in the sample could not be read."""
    info = inspect_records(args.file, sample=args.sample)
    status = 1 if info["images"]["unreadable_headers"] else 0
    if args.json:
        print(json.dumps(info, indent=1, ensure_ascii=True))
        return status
    mb = info["rec_bytes"] / 1e6
    print(f"file:          {info['file']}")
    print(f"records:       {info['records']} in {info['shards']} shard(s), {mb:.1f} MB")
    print(f"bytes/record:  {_fmt_stats(info['bytes_per_record'])}")
    if info.get("metadata_records") is not None:
        print(
            f"metadata records: {info['metadata_records']} (insightface header and identity "
            "records; not images)"
        )
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


def _describe_field(f: dict) -> str:
    """One line of a schema field: ``boxes        ragged float32 (n, 4), boxes, max 12``."""
    kind = f["kind"]
    parts = [kind]
    if kind in ("numeric", "ragged"):
        dims = [str(d) for d in f.get("shape", [])]
        shape = ", ".join((["n"] if kind == "ragged" else []) + dims)
        parts.append(f"{f['dtype']} ({shape}{',' if len(dims) + (kind == 'ragged') == 1 else ''})")
    if f.get("header"):
        parts.append("in the IRHeader labels")
    if f.get("geometry"):
        parts.append(f"geometry {f['geometry']}")
    if f.get("follows"):
        parts.append(f"follows {f['follows']}")
    if f.get("max_len") is not None:
        unit = "rows" if kind == "ragged" else "bytes"
        parts.append(f"at most {f['max_len']} {unit}")
    return f"{f['name']:<14} " + ", ".join(parts)
