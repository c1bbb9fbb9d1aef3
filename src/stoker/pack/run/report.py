"""What a pack run did: the counts the main process keeps while records come back, and the
:class:`PackReport` it returns, with its human summary."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker._core.errors import PackError
from stoker.formats.registry import DEFAULT as DEFAULT_FORMAT
from stoker.pack.plan.scan import ScanResult

__all__ = ["PackReport", "ShardCounts", "Tally"]


@dataclass(frozen=True)
class PackReport:
    """What a pack run did. ``written + rejected + ignored == found``."""

    found: int
    written: int
    rejected: int
    ignored: int
    classes: dict[str, int]
    reasons: dict[str, int]
    bytes_in: int
    bytes_out: int
    seconds: float
    passthrough: int
    reencoded: int
    resumed: int
    manifest: str
    shards: tuple[str, ...]
    rejects_path: str
    list_path: str | None = None
    ignored_links: int = 0
    unclassified: int = 0
    formats: dict[str, int] = field(default_factory=dict)
    resumed_bytes_in: int = 0  # the part of bytes_in that the resumed records were read from
    format: str = DEFAULT_FORMAT  # the format written
    action: str = "packed"  # or "converted"
    labels: int | None = None  # distinct labels among the records written, when counted

    def moved(self, at: Callable[[str], str]) -> PackReport:
        """The report with each output path ``p`` replaced by ``at(p)`` (the set moved from
        a staging folder to where it is committed)."""
        return dataclasses.replace(
            self,
            manifest=at(self.manifest),
            shards=tuple(at(s) for s in self.shards),
            rejects_path=at(self.rejects_path),
            list_path=None if self.list_path is None else at(self.list_path),
        )

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-safe dict, with the rates (``--json``)."""
        out = dataclasses.asdict(self)
        out["shards"] = list(self.shards)
        out["images_per_s"] = round(self.images_per_s, 3)
        out["mb_per_s"] = round(self.mb_per_s, 3)
        return out

    @property
    def images_per_s(self) -> float:
        return (self.written - self.resumed) / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        read = self.bytes_in - self.resumed_bytes_in
        return read / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """A few human lines: counts, sizes, rates, where the rejects are listed."""
        lines = [
            f"{self.action} {self.written} images ({self.bytes_out / 1e6:.1f} MB in "
            f"{len(self.shards)} {self.format} shard{'s' if len(self.shards) != 1 else ''}) "
            f"in {self.seconds:.1f} s: {self.images_per_s:.0f} images/s, "
            f"{self.mb_per_s:.1f} MB/s read",
            f"found {self.found}: written {self.written}, rejected {self.rejected}, "
            f"ignored {self.ignored}; {self._classes()}; "
            f"stored as is {self.passthrough}, re-encoded {self.reencoded}",
        ]
        if self.resumed:
            lines.append(f"resumed: {self.resumed} records kept from an interrupted run")
        if self.ignored_links:
            lines.append(
                f"{self.ignored_links} symlinked folder(s) not followed (follow_symlinks=True)"
            )
        if self.unclassified:
            lines.append(f"{self.unclassified} file(s) directly under the source folder ignored")
        if self.rejected:
            why = ", ".join(f"{k} {v}" for k, v in sorted(self.reasons.items()))
            lines.append(f"rejected {self.rejected} ({why}): see {self.rejects_path}")
        lines.append(f"manifest: {self.manifest}")
        return "\n".join(lines)

    def _classes(self) -> str:
        """The class count, or for a set without class names (a listing or .lst with numeric
        labels, ``--labels none``) its distinct labels, as ``stoker inspect`` counts them."""
        if self.classes or self.labels is None:
            return f"classes {len(self.classes)}"
        return f"labels {self.labels} distinct (no class names)"


class _Counts:
    """What stored records count for in the manifest: their source formats, the bytes read,
    and how many were stored as is, re-encoded or turned upright."""

    def __init__(self) -> None:
        self.formats: collections.Counter[str] = collections.Counter()
        self.bytes_in = 0
        self.passthrough = 0
        self.reencoded = 0
        self.exif_rotated = 0

    def count(self, fmt: str, rotated: bool, passthrough: bool, size_in: int) -> None:
        """Count one stored record."""
        self.formats[fmt] += 1
        self.bytes_in += size_in
        if passthrough:
            self.passthrough += 1
        else:
            self.reencoded += 1
        self.exif_rotated += int(rotated)


class Tally(_Counts):
    """The counts of one run over ``len(items)`` planned positions.

    ``written`` marks the positions stored; it and the byte, format, rotation and
    pass-through counts cover every record stored, those kept from an interrupted run included
    (a resume counts them in from the shards' side-cars, :meth:`ShardCounts.add_to`).
    """

    def __init__(self, scan: ScanResult, items: Any) -> None:
        super().__init__()
        self.scan = scan
        self.items = items  # the plan's items, in record order
        self.written = np.zeros(len(items), dtype=bool)
        self.item_rejects: list[tuple[int, str, str]] = []  # (position, reason, detail)
        self.resumed = 0
        self.resumed_bytes_in = 0

    @property
    def n_written(self) -> int:
        return int(self.written.sum())

    @property
    def n_rejected(self) -> int:
        """Rejects so far: while listing and while checking."""
        return len(self.scan.rejects) + len(self.item_rejects)

    def reasons(self) -> dict[str, int]:
        """Rejects by reason, sorted by reason."""
        counts = collections.Counter(r for _, r, _ in self.scan.rejects)
        counts.update(r for _, r, _ in self.item_rejects)
        return dict(sorted(counts.items()))

    def check_accounting(self) -> None:
        """Every file found is written, rejected or ignored, exactly once."""
        written, rejected, scan = self.n_written, self.n_rejected, self.scan
        if written + rejected + scan.ignored != scan.found:  # pragma: no cover - a bug
            raise PackError(
                f"internal accounting error: written {written} + rejected {rejected} + "
                f"ignored {scan.ignored} != found {scan.found}"
            )

    def manifest_counts(self) -> dict[str, Any]:
        """The counts in the manifest's ``pack`` block, after the options."""
        return {
            "found": self.scan.found,
            "written": self.n_written,
            "ignored": self.scan.ignored,
            "passthrough": self.passthrough,
            "reencoded": self.reencoded,
            "exif_rotated": self.exif_rotated,
            "formats": dict(sorted(self.formats.items())),
        }

    def report(
        self,
        *,
        shards: tuple[str, ...],
        bytes_out: int,
        seconds: float,
        manifest: str,
        rejects_path: str,
        list_path: str | None,
        format: str = DEFAULT_FORMAT,
        action: str = "packed",
    ) -> PackReport:
        """The :class:`PackReport` of a finished run that committed ``shards`` (each shard's
        main file) holding ``bytes_out`` bytes."""
        scan = self.scan
        labels = None
        if not scan.classes and isinstance(self.items, list):  # a convert's are not counted
            labels = len({_hashable(self.items[p].label) for p in np.flatnonzero(self.written)})
        return PackReport(
            found=scan.found,
            written=self.n_written,
            rejected=self.n_rejected,
            ignored=scan.ignored,
            classes=dict(scan.classes),
            reasons=self.reasons(),
            bytes_in=self.bytes_in,
            passthrough=self.passthrough,
            reencoded=self.reencoded,
            resumed=self.resumed,
            ignored_links=scan.ignored_links,
            unclassified=scan.unclassified,
            formats=dict(sorted(self.formats.items())),
            resumed_bytes_in=self.resumed_bytes_in,
            bytes_out=bytes_out,
            seconds=seconds,
            manifest=manifest,
            shards=shards,
            rejects_path=rejects_path,
            list_path=list_path,
            format=format,
            action=action,
            labels=labels,
        )


def _hashable(label: Any) -> Any:
    return tuple(label) if isinstance(label, (list, np.ndarray)) else label


class ShardCounts(_Counts):
    """What the records one shard job stored count for in the manifest, kept compact for its
    side-car: the positions written (as runs ``[a, b)``, rejects being the gaps), the source
    formats, the bytes read and the pass-through, re-encoded and rotated counts."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[list[int]] = []
        self.n = 0

    def add(self, pos: int, fmt: str, rotated: bool, passthrough: bool, size_in: int) -> None:
        """Count one record stored at ``pos`` (positions come in increasing order)."""
        runs = self.runs
        if runs and runs[-1][1] == pos:
            runs[-1][1] = pos + 1
        else:
            runs.append([pos, pos + 1])
        self.count(fmt, rotated, passthrough, size_in)
        self.n += 1

    def add_stored(
        self, positions: list[int], formats: collections.Counter[str], bytes_in: int
    ) -> None:
        """Count records stored as they were read at ``positions`` (increasing, after any
        counted before), ``formats`` their source formats, ``bytes_in`` their bytes."""
        runs = self.runs
        for pos in positions:
            if runs and runs[-1][1] == pos:
                runs[-1][1] = pos + 1
            else:
                runs.append([pos, pos + 1])
        self.formats.update(formats)
        self.bytes_in += bytes_in
        self.passthrough += len(positions)
        self.n += len(positions)

    def to_json(self) -> dict[str, Any]:
        return {
            "written": self.runs,
            "formats": dict(sorted(self.formats.items())),
            "bytes_in": self.bytes_in,
            "passthrough": self.passthrough,
            "reencoded": self.reencoded,
            "exif_rotated": self.exif_rotated,
        }

    @staticmethod
    def add_to(tally: Tally, doc: dict[str, Any], *, resumed: bool) -> None:
        """Count a side-car's ``to_json`` into ``tally`` (``resumed``: its shard was found
        done by this run, its records count as resumed)."""
        n = 0
        for a, b in doc["written"]:
            tally.written[int(a) : int(b)] = True
            n += int(b) - int(a)
        tally.formats.update({str(k): int(v) for k, v in doc["formats"].items()})
        tally.bytes_in += int(doc["bytes_in"])
        tally.passthrough += int(doc["passthrough"])
        tally.reencoded += int(doc["reencoded"])
        tally.exif_rotated += int(doc["exif_rotated"])
        if resumed:
            tally.resumed += n
            tally.resumed_bytes_in += int(doc["bytes_in"])
