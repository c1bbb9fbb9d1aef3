"""What ``stoker verify`` reports for any format: each problem with the file, the record key,
the byte offset and the reason, and the counts of what was walked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from stoker._core.errors import located

__all__ = ["Problem", "VerifyReport", "decode_failure", "spread"]


def spread(a: np.ndarray) -> dict[str, float]:
    """``min``, ``median``, ``mean`` (2 decimals) and ``max`` of ``a``, as ``stoker inspect``
    shows them (bytes per record, records per label, image sides); ``{}`` when empty."""
    if a.size == 0:
        return {}
    return {
        "min": float(a.min()),
        "median": float(np.median(a)),
        "mean": round(float(a.mean()), 2),
        "max": float(a.max()),
    }


def decode_failure(decode: Callable[[bytes], object], image: bytes) -> str | None:
    """``None`` when ``decode(image)`` returns; else why it raised, as a verify problem
    states it. A caller walking a memory-mapped file hands over a copy and keeps no view of
    the map in its own frame meanwhile: a decoder may leave its frames (and through them its
    callers') alive in a reference cycle until the garbage collector runs, and a view of the
    map in one of them would keep the map from closing."""
    try:
        decode(image)
    except Exception as e:  # noqa: BLE001 - the decoder's own error type, whatever it is
        return f"image does not decode: {type(e).__name__}: {e}"
    return None


@dataclass(frozen=True)
class Problem:
    """One finding: the file, the record key (when known), the byte offset (when it applies),
    the ``.idx`` line (when it came from one) and the reason."""

    path: str
    key: int | None
    offset: int | None
    reason: str
    idx_line: int | None = None

    def __str__(self) -> str:
        return located(
            self.reason,
            self.path,
            ("key {}", self.key),
            ("byte offset {}", self.offset),
            (".idx line {}", self.idx_line),
        )


@dataclass
class VerifyReport:
    """What a verify found (``verify_records`` for RecordIO, each format's ``verify``).

    ``records``: records found walking the ``.rec`` file(s); ``indexed``: ``.idx`` entries;
    ``data_bytes``: bytes walked; ``checksummed``: records whose CRC32C was compared;
    ``decoded``: images passed to ``decode``; ``problems``: the first ``max_problems``
    findings; ``problem_count``: all of them; ``notes``: things worth saying that are not
    problems (e.g. no checksum file).
    """

    path: str
    records: int = 0
    indexed: int = 0
    data_bytes: int = 0
    checksummed: int = 0
    decoded: int = 0
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0
    notes: list[str] = field(default_factory=list)
    max_problems: int = 1000

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def add(self, problem: Problem) -> None:
        self.problem_count += 1
        if len(self.problems) < self.max_problems:
            self.problems.append(problem)

    def summary(self) -> str:
        head = (
            f"{self.path}: {self.records} records, {self.indexed} indexed, "
            f"{self.data_bytes} bytes; checksums compared: {self.checksummed}; "
            f"decoded: {self.decoded}; "
        )
        return head + ("OK" if self.ok else f"{self.problem_count} problem(s)")
