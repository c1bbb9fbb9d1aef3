"""``stoker index``: a manifest for WebDataset tars that stoker did not write, read in place
(``stoker.pack.index``)."""

from __future__ import annotations

import argparse

from stoker.cli._remote import add_remote_arguments, guarded, remote_options

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]

HELP = "index WebDataset tars stoker did not write (a brace pattern, a glob or a list), in place"
DESCRIPTION = """Read each tar SOURCE names once (its size, sha256 and member index) and write
OUT, a stoker manifest with a small index side-car for each tar: the collection is then a
stoker set (any order, ranks, exact resume, the shard cache, verify), read in place. SOURCE is
a brace pattern ('s3://bucket/shards-{000000..000099}.tar'), a local glob, @FILE (a path or
URL a line) or one tar; OUT (NAME.stoker.json, a path or URL) goes in the tars' folder, or
anywhere for tar URLs (named by URL, their side-cars under OUT's folder; read with --allow-host).
Samples are grouped as WebDataset groups them; a sample without exactly one image stops the
index naming it; members other than the image, .cls, .txt and .json are left unread. A killed
run resumes with the tars it had not finished."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="the tars: a brace pattern, a glob, @FILE or one tar")
    p.add_argument(
        "out", help="the manifest to write, NAME.stoker.json (in the tars' folder for local tars)"
    )
    p.add_argument("--workers", type=int, default=4, help="tars indexed at once (default 4)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_remote_arguments(p)


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        from stoker.formats.remote import RemoteOptions
        from stoker.pack.index import index_collection

        m = index_collection(
            args.source,
            args.out,
            workers=args.workers,
            remote=remote_options(args) or RemoteOptions(),
            progress=False if args.quiet else None,
        )
        print(f"indexed {len(m['shards'])} tars, {m['records']} samples: {args.out}")
        return 0

    return guarded("index", args, body)
