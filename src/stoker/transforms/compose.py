"""Chains and choices: Compose, RandomChoice, OneOf, RandomApply, and plain callables.

``Compose`` runs its steps in order. Built-in ops are trusted to return what their
``output_spec`` declares (the test suite holds them to it); any other step (a plain callable
wrapped by ``as_transform``, a user's ``Transform`` subclass) has its output checked after
every call, and a mismatch raises ``SpecError`` naming the step index, the step, what came
back and what was declared.

``apply_targets`` runs the same steps with the same draws as ``__call__`` and moves the
sample's boxes, points and masks through each; ``check_targets`` asks every step and branch
and names the one that cannot carry them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from stoker._core.errors import SpecError
from stoker._core.specs import ArraySpec
from stoker.transforms.base import Transform

if TYPE_CHECKING:
    from stoker.transforms.targets import Targets

__all__ = [
    "Compose",
    "FnTransform",
    "OneOf",
    "PerSet",
    "RandomApply",
    "RandomChoice",
    "as_transform",
    "decode_hint",
    "merge_specs",
]


def _trusted(t: Transform) -> bool:
    """True when ``t`` (and everything inside it) is a built-in op whose output needs no check.

    The answer is cached on the object: this runs for every sample.
    """
    cached = getattr(t, "__dict__", {}).get("_stoker_trusted")
    if cached is not None:
        return bool(cached)
    own = getattr(t, "_trusted", None)
    value = bool(own()) if callable(own) else bool(type(t)._builtin)
    try:
        object.__setattr__(t, "_stoker_trusted", value)
    except (AttributeError, TypeError):  # slots or a foreign object: just don't cache
        pass
    return value


def merge_specs(specs: Sequence[ArraySpec], *, what: str) -> ArraySpec:
    """One spec covering all of ``specs``: dimensions that differ become ``None``.

    Raises ``SpecError`` when ranks or dtypes differ (no batch slot could hold them all).
    """
    first = specs[0]
    for s in specs[1:]:
        if len(s.shape) != len(first.shape) or s.dtype != first.dtype:
            listed = ", ".join(x.describe() for x in specs)
            raise SpecError(f"{what}: the branches return incompatible arrays: {listed}")
    dims = tuple(
        d if all(s.shape[i] == d for s in specs) else None for i, d in enumerate(first.shape)
    )
    return ArraySpec(dims, first.dtype)


def _takes_rng(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` wants ``(img, rng)``: two required positional parameters, *args, or a
    parameter named ``rng``; False for ``fn(img)``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    required = 0
    for p in sig.parameters.values():
        if p.name == "rng" and p.kind is not p.KEYWORD_ONLY:
            return True
        if p.kind is p.VAR_POSITIONAL:
            return True
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
            required += 1
    return required >= 2


def _fn_name(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


@dataclass(frozen=True)
class FnTransform(Transform):
    """A plain callable standing in a chain; made by :func:`as_transform`."""

    fn: Callable[..., np.ndarray]
    _: KW_ONLY
    output: ArraySpec | str | None = None
    takes_rng: bool = True
    moves_geometry: bool | None = None

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.takes_rng:
            return self.fn(img, rng)
        return self.fn(img)

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        if isinstance(self.output, ArraySpec):
            return self.output
        if self.output == "same":
            return in_spec
        # unknown: same rank and dtype assumed, every size free
        return ArraySpec((None,) * len(in_spec.shape), in_spec.dtype)

    def __repr__(self) -> str:
        return f"as_transform({_fn_name(self.fn)})"


def as_transform(
    fn: Callable[..., np.ndarray] | Transform,
    *,
    output: ArraySpec | str | None = None,
    takes_rng: bool | None = None,
    moves_geometry: bool | None = None,
) -> Transform:
    """Let a plain callable stand in a chain.

    ``fn(img, rng) -> ndarray`` or ``fn(img) -> ndarray`` (detected from its signature, or
    say so with ``takes_rng``). ``output``: the ``ArraySpec`` it returns, ``"same"`` (the
    input's shape and dtype), or ``None`` (unknown sizes; same rank and dtype assumed; the
    loader then checks each sample against its batch slot). Picklable when ``fn`` is (a
    module-level function or object, not a lambda). A ``Transform`` is returned unchanged.

    ``moves_geometry=False`` says that ``fn`` leaves boxes, points and masks where they are
    (a colour or noise op); left ``None`` (unknown), a chain carrying any of them is refused
    before data flows, since a function that moved pixels would silently misplace them. A
    function that moves geometry cannot say how: write a ``Transform`` with ``apply_targets``.

    An albumentations pipeline takes keywords; wrap it in a module-level function::

        def aug(img):
            return pipeline(image=img)["image"]
    """
    if isinstance(fn, Transform):
        return fn
    if not callable(fn):
        raise TypeError(f"as_transform: expected a callable, got {type(fn).__name__}")
    if output is not None and not isinstance(output, ArraySpec) and output != "same":
        raise TypeError(
            f"as_transform: output must be an ArraySpec, 'same' or None, got {output!r}"
        )
    if moves_geometry not in (None, False):
        raise ValueError(
            f"as_transform: moves_geometry must be None or False, got {moves_geometry!r}; a "
            "function cannot say how it moves boxes, points and masks (write a Transform with "
            "apply_targets)"
        )
    if takes_rng is None:
        takes_rng = _takes_rng(fn)
    return FnTransform(fn, output=output, takes_rng=bool(takes_rng), moves_geometry=moves_geometry)


def as_chain(t: Any) -> Transform | None:
    """A loader's ``transforms=`` as one transform: ``None``, a ``Transform`` as it is, a list
    or tuple as a :class:`Compose`, any other callable through :func:`as_transform`."""
    if t is None or isinstance(t, Transform):
        return t
    return Compose(t) if isinstance(t, (list, tuple)) else as_transform(t)


@dataclass(frozen=True)
class PerSet:
    """One chain per set of a mixture: ``Loader([A, B], weights=..., transforms=PerSet([ta,
    tb]))`` runs each sample through its set's chain (each as ``transforms=`` takes it: a
    transform, a list as a ``Compose``, a callable, ``None``). A plain list stays one chain
    (a ``Compose``); every chain must end in the same shape and dtype (the loader checks)."""

    chains: Sequence[Any]

    def __post_init__(self) -> None:
        if not isinstance(self.chains, (list, tuple)) or not self.chains:
            raise TypeError(f"PerSet takes a list of chains, one per set, got {self.chains!r}")
        object.__setattr__(self, "chains", tuple(as_chain(c) for c in self.chains))


def _steps(transforms: Iterable[Any], owner: str) -> tuple[Transform, ...]:
    if isinstance(transforms, (Transform, np.ndarray, str, bytes)) or callable(transforms):
        raise TypeError(f"{owner}: expects a list of transforms, got {type(transforms).__name__}")
    out = []
    for i, t in enumerate(transforms):
        if not isinstance(t, Transform) and not callable(t):
            raise TypeError(f"{owner}: step {i} is not a transform or callable: {t!r}")
        out.append(as_transform(t))
    return tuple(out)


def _run_checked(
    t: Transform,
    img: np.ndarray,
    targets: Targets | None,
    rng: np.random.Generator,
    where: str,
    *where_args: Any,
) -> np.ndarray:
    """Run ``t`` (its ``apply_targets`` when ``targets`` is given); check an untrusted step's
    output, and that it keeps the frame its targets are in. ``where.format(*where_args)``
    names the step in the error and is only formatted when there is one (this runs per
    sample)."""
    if _trusted(t):
        return t(img, rng) if targets is None else t.apply_targets(img, targets, rng)
    expected = t.output_spec(ArraySpec(img.shape, img.dtype.name))
    out = t(img, rng) if targets is None else t.apply_targets(img, targets, rng)
    if not isinstance(out, np.ndarray):
        raise SpecError(
            f"{where.format(*where_args)}: returned {type(out).__name__}, expected an ndarray "
            f"{expected.describe()}"
        )
    if not expected.accepts(out):
        raise SpecError(
            f"{where.format(*where_args)}: got {tuple(out.shape)} {out.dtype}, expected "
            f"{expected.describe()}"
        )
    if targets is not None and not targets.empty and out.shape[:2] != targets.hw:
        raise SpecError(
            f"{where.format(*where_args)}: returned a {out.shape[0]}x{out.shape[1]} image but "
            f"left the boxes, points and masks in a {targets.hw[0]}x{targets.hw[1]} frame"
        )
    return out


def _check_each(
    steps: Sequence[Transform], kinds: frozenset[str], where: str, *where_args: Any
) -> None:
    """``check_targets`` on every step; the error names the step (``where`` takes its index
    and the step after ``where_args``)."""
    for i, t in enumerate(steps):
        try:
            t.check_targets(kinds)
        except SpecError as e:
            label = repr(t) if len(repr(t)) <= 60 else type(t).__name__
            raise SpecError(f"{where.format(*where_args, i, label)}: {e}") from e


@dataclass(frozen=True)
class Compose(Transform):
    """Apply ``transforms`` in order. Plain callables are wrapped with :func:`as_transform`.

    ``Compose([])`` is the identity. Its decode hint is that of its first step.
    """

    transforms: Sequence[Any]  # stored as tuple[Transform, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "transforms", _steps(self.transforms, "Compose"))

    def _trusted(self) -> bool:
        return all(_trusted(t) for t in self.transforms)

    moves_geometry = True  # it carries targets through its steps (check_targets asks them)

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        for i, t in enumerate(self.transforms):
            img = _run_checked(t, img, None, rng, "Compose step {} ({!r})", i, t)
        return img

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        for i, t in enumerate(self.transforms):
            img = _run_checked(t, img, targets, rng, "Compose step {} ({!r})", i, t)
        return img

    def check_targets(self, kinds: frozenset[str]) -> None:
        if kinds:
            _check_each(self.transforms, kinds, "Compose step {} ({})")

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        spec = in_spec
        for i, t in enumerate(self.transforms):
            try:
                spec = t.output_spec(spec)
            except SpecError as e:
                raise SpecError(f"Compose step {i} ({t!r}) on {spec.describe()}: {e}") from e
        return spec

    def decode_hint(self, full_hw: tuple[int, int]) -> tuple[int, int] | None:
        if not self.transforms:
            return None
        return self.transforms[0].decode_hint(full_hw)

    def __len__(self) -> int:
        return len(self.transforms)

    def __getitem__(self, i: int) -> Transform:
        return self.transforms[i]


def _weights(weights: Sequence[float] | None, n: int, owner: str) -> tuple[float, ...] | None:
    if weights is None:
        return None
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(
            f"{owner}: weights must be {n} non-negative numbers with a positive sum, got {weights!r}"
        )
    return tuple(float(x) for x in w / w.sum())


@dataclass(frozen=True)
class RandomChoice(Transform):
    """Apply exactly one of ``transforms``, chosen uniformly or by ``weights`` (normalised).

    The seed-002 recipe is ``RandomChoice`` of the geometric ops followed by ``RandomChoice``
    of the filters. The output spec merges the branches (dimensions that differ become None).
    """

    transforms: Sequence[Any]  # stored as tuple[Transform, ...]
    _: KW_ONLY
    weights: Sequence[float] | None = None

    def __post_init__(self) -> None:
        steps = _steps(self.transforms, type(self).__name__)
        if not steps:
            raise ValueError(f"{type(self).__name__}: needs at least one transform")
        object.__setattr__(self, "transforms", steps)
        object.__setattr__(self, "weights", _weights(self.weights, len(steps), type(self).__name__))

    def _trusted(self) -> bool:
        return all(_trusted(t) for t in self.transforms)

    def choose(self, rng: np.random.Generator) -> int:
        """Index of the branch to apply."""
        if self.weights is None:
            return int(rng.integers(0, len(self.transforms)))
        return int(rng.choice(len(self.transforms), p=self.weights))

    moves_geometry = True  # it carries targets through its branches (check_targets asks them)

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        i = self.choose(rng)
        t = self.transforms[i]
        return _run_checked(t, img, None, rng, "{} branch {} ({!r})", type(self).__name__, i, t)

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        i = self.choose(rng)
        t = self.transforms[i]
        return _run_checked(t, img, targets, rng, "{} branch {} ({!r})", type(self).__name__, i, t)

    def check_targets(self, kinds: frozenset[str]) -> None:
        if kinds:
            _check_each(self.transforms, kinds, "{} branch {} ({})", type(self).__name__)

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        return merge_specs(
            [t.output_spec(in_spec) for t in self.transforms], what=type(self).__name__
        )


@dataclass(frozen=True)
class OneOf(RandomChoice):
    """With probability ``p`` apply one of ``transforms`` (chosen as in ``RandomChoice``),
    otherwise return the input unchanged: albumentations' ``OneOf``. ``p=1`` is
    ``RandomChoice``."""

    _: KW_ONLY
    p: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= float(self.p) <= 1.0:
            raise ValueError(f"OneOf: p must lie in [0, 1], got {self.p!r}")

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if rng.random() >= self.p:
            return img
        return super().__call__(img, rng)

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        if rng.random() >= self.p:
            return img
        return super().apply_targets(img, targets, rng)

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        specs = [t.output_spec(in_spec) for t in self.transforms]
        if self.p < 1.0:
            specs.append(in_spec)
        return merge_specs(specs, what="OneOf")


@dataclass(frozen=True)
class RandomApply(Transform):
    """Apply ``transform`` (a list is composed) with probability ``p``, else pass through."""

    transform: Any  # a Transform, a callable, or a list (composed)
    p: float = 0.5

    def __post_init__(self) -> None:
        t = self.transform
        if isinstance(t, (list, tuple)):
            t = Compose(t)
        elif not isinstance(t, Transform):
            if not callable(t):
                raise TypeError(f"RandomApply: expected a transform, got {t!r}")
            t = as_transform(t)
        object.__setattr__(self, "transform", t)
        if not 0.0 <= float(self.p) <= 1.0:
            raise ValueError(f"RandomApply: p must lie in [0, 1], got {self.p!r}")

    def _trusted(self) -> bool:
        return _trusted(self.transform)

    moves_geometry = True  # it carries targets through its transform (check_targets asks it)

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if rng.random() >= self.p:
            return img
        return _run_checked(self.transform, img, None, rng, "RandomApply ({!r})", self.transform)

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        if rng.random() >= self.p:
            return img
        return _run_checked(self.transform, img, targets, rng, "RandomApply ({!r})", self.transform)

    def check_targets(self, kinds: frozenset[str]) -> None:
        if not kinds:
            return
        try:
            self.transform.check_targets(kinds)
        except SpecError as e:
            raise SpecError(f"RandomApply ({type(self.transform).__name__}): {e}") from e

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        out = self.transform.output_spec(in_spec)
        if self.p >= 1.0:
            return out
        if self.p <= 0.0:
            return in_spec
        return merge_specs([out, in_spec], what="RandomApply")


def decode_hint(transform: Any, full_hw: tuple[int, int]) -> tuple[int, int] | None:
    """``transform.decode_hint(full_hw)`` when it has one, else ``None`` (decode at full size)."""
    fn = getattr(transform, "decode_hint", None)
    if fn is None:
        return None
    hint = fn((int(full_hw[0]), int(full_hw[1])))
    return None if hint is None else (int(hint[0]), int(hint[1]))
