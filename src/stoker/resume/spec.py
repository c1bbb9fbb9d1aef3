"""``LoaderSpec``: a loader configuration as a small frozen object, the factory that
``stoker check-resume`` builds from its command line and hands to its child processes."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from stoker._core.checks import check_int

__all__ = ["LoaderSpec", "import_attr"]


def import_attr(spec: str, what: str) -> Any:
    """The object ``"package.module:name"`` names (``name`` may be dotted)."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{what} {spec!r}: expected 'module:attribute'")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{what} {spec!r}: cannot import {module!r} ({e})") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{what} {spec!r}: {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class LoaderSpec:
    """``spec(rank=r, world_size=n)`` is ``stoker.Loader(source, ...)`` for rank ``r`` of ``n``.

    ``transforms``: a transform object, a preset name (``stoker.transforms.presets``) or
    ``"module:attr"`` of a transform (or of a class or function that makes one), resolved in
    the process that builds the loader. ``shuffle``: ``False``, ``True`` or ``"shards"``.
    ``options``: any other ``Loader`` keyword (``storage_options``, ``cache_dir``, ...).
    ``source``: a set, or a tuple of sets mixed at ``options["weights"]`` (``docs/mixing.md``)."""

    source: str | tuple[str, ...]
    batch_size: int
    transforms: Any = None
    shuffle: bool | str = False
    seed: int = 0
    drop_last: bool = False
    workers: int | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """A batch size below 1 is refused here, before any child starts."""
        check_int("batch_size", self.batch_size, minimum=1)

    def resolved_transforms(self) -> Any:
        t = self.transforms
        if t is None or t == "none":
            return None
        if not isinstance(t, str):
            return t
        if ":" not in t:
            from stoker.transforms.presets import get_preset

            return get_preset(t)
        obj = import_attr(t, "transforms")
        if isinstance(obj, type) or not hasattr(obj, "output_spec"):
            obj = obj()  # a class, or a function that makes the transform
        return obj

    def __call__(self, *, rank: int, world_size: int) -> Any:
        from stoker.loader import Loader

        return Loader(
            list(self.source) if isinstance(self.source, tuple) else self.source,
            batch_size=self.batch_size,
            transforms=self.resolved_transforms(),
            shuffle=self.shuffle,
            seed=self.seed,
            drop_last=self.drop_last,
            workers=self.workers,
            rank=rank,
            world_size=world_size,
            **self.options,
        )
