"""JSON documents stoker reads from files it did not write itself (manifests, listings): an
object that names a key twice is refused, where ``json`` would keep the last value silently."""

from __future__ import annotations

from typing import Any

__all__ = ["DuplicateKeyError", "unique_keys"]


class DuplicateKeyError(ValueError):
    """A JSON object names ``key`` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears twice in one object")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object's dict, or :class:`DuplicateKeyError`
    naming the first key that comes back."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise DuplicateKeyError(k)
            seen.add(k)
    return out
