"""Every ``stoker pack`` option in one frozen object, checked once when it is made.

The same :class:`PackOptions` is what the command line builds, what :func:`stoker.pack`
builds from its keyword arguments, what each worker process receives (it is module-level,
frozen and picklable), and, in JSON form, the settings in the resume journal's fingerprint
(:meth:`PackOptions.journal_json`) and the option part of the manifest's ``pack`` block
(:meth:`PackOptions.manifest_json`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stoker._core.checks import check_choice, check_int, check_optional_int
from stoker._core.schema import Schema
from stoker._core.system import usable_cores
from stoker.formats.registry import DEFAULT as DEFAULT_FORMAT
from stoker.pack.images import DEFAULT_MAX_PIXELS, check_image

__all__ = ["ENGINES", "JOURNAL_VERSION", "LABELS", "LAYOUTS", "PackOptions", "output_prefix"]

#: Version of the journal's fingerprint settings; a change starts interrupted runs over.
JOURNAL_VERSION = 1

#: The options that decide the output bytes, in the order the journal and manifest list them.
_OUTPUT_OPTIONS = ("resize", "quality", "shuffle", "seed", "shard_size", "max_pixels")


#: Where a folder's labels come from: ``"folders"``, one class per top-level subfolder (a
#: folder of images without subfolders is refused); ``"none"``, no labels (every record 0, no
#: class names).
LABELS = ("folders", "none")

#: How the records of a set lie: ``"plain"``, one record per image; ``"insightface"``, the
#: images at keys ``1..N`` (one identity per class folder, each identity's images together),
#: then insightface's header record 0 and one record per identity with its range of keys
#: (``docs/pack.md``), one RecordIO file.
LAYOUTS = ("plain", "insightface")

#: What runs a pack's shards: this machine's process pool, or one Ray task per shard.
ENGINES = ("local", "ray")

#: The integer options, checked in this order: (minimum, maximum, None allowed).
_INT_RANGES: dict[str, tuple[int, int | None, bool]] = {
    "workers": (1, None, True),
    "resize": (1, None, True),
    "shard_size": (1, None, True),
    "max_rejects": (0, None, True),
    "max_pixels": (1, None, False),
    "seed": (0, None, False),
    "quality": (1, 100, True),
}


def _load_schema(value: Any) -> Schema | None:
    """``schema=`` as a :class:`Schema`: given as one, as its JSON dict, or as a JSON file."""
    if value is None or isinstance(value, Schema):
        return value
    where = "schema"
    if isinstance(value, (str, os.PathLike)):
        where = os.fspath(value)
        try:
            with open(where, "rb") as f:
                value = json.loads(f.read(1 << 20).decode("utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"schema {where}: cannot read it as JSON: {e}") from None
    elif not isinstance(value, dict):
        raise TypeError(
            f"schema must be a Schema, its JSON dict or a JSON file path, got {type(value).__name__}"
        )
    return Schema.from_json(value, where=where)


def output_prefix(out: str | os.PathLike[str]) -> str:
    """``OUT`` from ``OUT``, ``OUT.rec`` or ``OUT.stoker.json``."""
    s = os.fspath(out)
    for suffix in (".stoker.json", ".rec"):
        if s.endswith(suffix):
            return s[: -len(suffix)]
    return s


def _check_formats(fmt: Any, source_format: Any) -> None:
    """``format`` must name a format stoker writes, ``source_format`` one it reads."""
    from stoker.formats.registry import get

    for name, value in (("format", fmt), ("source_format", source_format)):
        if value is None and name == "source_format":
            continue
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a format name (str), got {type(value).__name__}")
        found = get(value)  # ValueError naming the known formats
        if name == "format" and found.writer is None:
            raise ValueError(f"format {value!r} is read-only in stoker: pick one it writes")


@dataclass(frozen=True)
class PackOptions:
    """The options of one pack run (see :func:`stoker.pack` for each one's meaning).

    Making one checks every value: a wrong type raises ``TypeError``, a value out of range
    ``ValueError``, each naming the option. Paths are kept as ``str``; ``check`` left at
    ``None`` becomes :func:`stoker.pack.images.check_image`.
    """

    src: str | os.PathLike[str]
    out: str | os.PathLike[str]
    workers: int | None = None
    resize: int | None = None
    quality: int | None = None
    shuffle: bool = False
    seed: int = 0
    shard_size: int | None = None
    list_file: bool = False
    overwrite: bool = False
    resume: bool = True
    max_rejects: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    follow_symlinks: bool = False
    root: str | os.PathLike[str] | None = None
    allow_outside_root: bool = False
    progress: bool | None = None
    #: a listing's schema in place of the inferred one: a Schema, its JSON dict, or the path
    #: of a JSON file holding it (``Schema.to_json`` layout)
    schema: Any = None
    # None means check_image; a stand-in must be module-level (fault-injection tests)
    check: Callable[..., Any] | None = None
    #: the format written: a registry name whose format has a writer
    format: str = DEFAULT_FORMAT
    #: ``stoker convert``: ``src`` is a data set read through ``stoker.formats.open``, its
    #: samples copied as they are (``source_format`` names its format when the path cannot)
    convert: bool = False
    source_format: str | None = None
    #: options for the source's reader (an LSUN database's ``label=``, say)
    source_options: dict[str, Any] | None = None
    #: where a folder's labels come from (:data:`LABELS`)
    labels: str = "folders"
    #: what runs the shards (:data:`ENGINES`): ``"local"``, this machine's process pool;
    #: ``"ray"``, one Ray task per shard (``docs/scale.md``)
    engine: str = "local"
    #: the Ray cluster to use with ``engine="ray"`` (``None``: ``RAY_ADDRESS``, else a Ray
    #: started for this run on this machine)
    ray_address: str | None = None
    #: how the records lie (:data:`LAYOUTS`)
    layout: str = "plain"

    def __post_init__(self) -> None:
        put = object.__setattr__  # a frozen dataclass normalises its own fields here
        put(self, "src", os.fspath(self.src))
        for name, (lo, hi, none_ok) in _INT_RANGES.items():
            check = check_optional_int if none_ok else check_int
            value = check(name, getattr(self, name), minimum=lo, maximum=hi)
            put(self, name, value)
        for name in (
            "shuffle",
            "list_file",
            "overwrite",
            "resume",
            "follow_symlinks",
            "allow_outside_root",
        ):
            put(self, name, bool(getattr(self, name)))
        put(self, "out", os.fspath(self.out))
        put(self, "root", os.fspath(self.root) if self.root else None)
        if self.check is None:
            put(self, "check", check_image)
        put(self, "schema", _load_schema(self.schema))
        _check_formats(self.format, self.source_format)
        put(self, "convert", bool(self.convert))
        check_choice("labels", self.labels, LABELS)
        check_choice("engine", self.engine, ENGINES)
        if self.ray_address is not None and not isinstance(self.ray_address, str):
            raise TypeError(f"ray_address must be a str, got {type(self.ray_address).__name__}")
        if self.ray_address is not None and self.engine != "ray":
            raise ValueError("ray_address is for engine='ray' (--engine ray)")
        if self.convert and self.labels != "folders":
            raise ValueError("labels applies to packing a folder; a convert keeps the source's")
        if self.source_options is not None and not isinstance(self.source_options, dict):
            raise TypeError(
                f"source_options must be a dict, got {type(self.source_options).__name__}"
            )
        check_choice("layout", self.layout, LAYOUTS)
        if self.layout != "plain":
            self._check_layout()
        prefix = self.prefix
        if not prefix or os.path.isdir(prefix):
            raise ValueError(f"out must name a file prefix (e.g. data/train), got {self.out!r}")

    def _check_layout(self) -> None:
        """What an insightface layout rules out: one RecordIO file of a folder's images in
        folder order, every image kept (the identity ranges have no gaps)."""
        clash = [
            what
            for what, bad in (
                # the layout is the default format's own (RecordIO's)
                (f"format={self.format!r} (it is RecordIO's)", self.format != DEFAULT_FORMAT),
                ("shard_size (one .rec)", self.shard_size is not None),
                ("shuffle (each identity's images lie together)", self.shuffle),
                ("convert (it packs an image folder)", self.convert),
                (f"labels={self.labels!r} (one identity per folder)", self.labels != "folders"),
                (f"engine={self.engine!r} (this machine's pool)", self.engine != "local"),
                ("max_rejects > 0 (any reject stops the run)", bool(self.max_rejects)),
            )
            if bad
        ]
        if clash:
            raise ValueError(f"layout='insightface' (--layout insightface) rules out {clash[0]}")

    @property
    def prefix(self) -> str:
        """The output path prefix: ``out`` without ``.rec`` or ``.stoker.json``."""
        return output_prefix(self.out)

    def worker_count(self) -> int:
        """``workers``, or the cores this process may use when it is None."""
        return self.workers or usable_cores()

    def _output_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _OUTPUT_OPTIONS}

    def journal_json(self) -> dict[str, Any]:
        """The settings part of the resume journal's fingerprint (a rerun resumes only when
        they are equal): the options that decide the output bytes and the check's name."""
        check = self.check or check_image
        name = f"{check.__module__}.{check.__qualname__}"
        out = {"journal": JOURNAL_VERSION, **self._output_json(), "check": name}
        if self.format != DEFAULT_FORMAT:  # absent for the default: its journals stay as they were
            out["format"] = self.format
        if self.layout != "plain":
            out["layout"] = self.layout
        if self.convert:
            out["convert"] = self.source_format or "auto"
            out["source_options"] = json.loads(
                json.dumps(self.source_options or {}, sort_keys=True, default=str)
            )
        return out

    def manifest_json(self, *, from_lst: bool, listing: bool = False) -> dict[str, Any]:
        """The options at the head of the manifest's ``pack`` block; ``from_lst`` says whether
        the source was an im2rec list (keys from its index) or a folder (keys by position),
        ``listing`` a ``.jsonl``/``.csv`` listing (keys by position); a convert's source keeps
        its own keys."""
        if self.convert:
            return {
                "source": os.path.basename(os.path.normpath(self.src)),
                "source_kind": "convert",
                "keys": "source",
                "shuffle": self.shuffle,
                "seed": self.seed,
                "shard_size": self.shard_size,
            }
        out = {
            "source": os.path.basename(os.path.normpath(self.src)),
            "source_kind": "lst" if from_lst else "listing" if listing else "folder",
            "keys": "lst-index" if from_lst else "position",
            **self._output_json(),
            "follow_symlinks": self.follow_symlinks,
        }
        if self.labels != "folders":  # absent by default: manifests stay as they were
            out["labels"] = self.labels
        if self.layout != "plain":
            out["layout"] = self.layout
        return out
