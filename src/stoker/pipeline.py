"""Layer 2: a frozen, picklable description of what happens to one sample, checked up front.

``Pipeline(input_spec, transforms=..., pair_with=..., layout=..., decode=...)`` says how the
bytes (or array) of one sample become the rows of a batch:

1. decode (when the source is encoded) with :func:`stoker.codecs.decode`; when the transforms
   offer ``decode_hint(full_hw)``, a JPEG is decoded at a reduced DCT scale that still covers it;
2. ``transforms(img, rng)``; a chain that starts with a resize, a crop and a flip runs them as
   one op that resizes only the kept window and mirrors straight into the batch row
   (:mod:`stoker.transforms.fused`: the same draws, the same pixels within its documented
   tolerance; ``fuse=False`` runs the steps one by one);
3. with ``pair_with``: a second row ``pair_with(transforms(img), rng)``;
4. placement into the batch: a per-batch width (from a length-bucketing sampler) is met by
   right-padding with zeros when the sample is narrower and by resizing the width alone when
   it is wider; a per-batch height (from aspect-ratio buckets, with the width) by padding the
   bottom with zeros; ``layout="NCHW"`` transposes.

Construction walks the transforms' ``output_spec`` chain and refuses, naming the step, a chain
whose end has no fixed shape (the loader allocates batch slots once, so it must know it), and,
when the samples carry geometric fields (``geometry``: boxes, points, masks), a step that
cannot move them. Such samples go through :meth:`Pipeline.carry_targets`, which runs the
chain's ``apply_targets``: the same draws and the same image as ``fill_row``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from stoker._core.errors import SpecError
from stoker._core.specs import ArraySpec
from stoker.codecs import DEFAULT_MAX_PIXELS, check_max_pixels
from stoker.codecs import decoder as _decoder
from stoker.transforms.base import Transform
from stoker.transforms.color import Normalize
from stoker.transforms.compose import Compose, FnTransform
from stoker.transforms.fused import FusedCrop, RowWriter, fuse, mirror, write_chw, write_head
from stoker.transforms.geometry import RandomResizedCrop
from stoker.transforms.mix import BatchMix
from stoker.transforms.targets import Targets

__all__ = ["DecodeOptions", "Pipeline", "fit_height", "fit_width", "leaves_size_open"]

LAYOUTS = ("NHWC", "NCHW")


@dataclass(frozen=True)
class DecodeOptions:
    """``fast``: fast DCT and upsampling (a little less accurate); ``scale_on_decode``: let the
    transforms' ``decode_hint`` pick a reduced JPEG decode scale; ``max_pixels``: an image whose
    header declares more pixels (width x height) is refused with ``ImageTooLargeError`` before
    any pixel is decoded (a decompression bomb), ``None`` for no limit; ``region``: a leading
    ``RandomResizedCrop`` decodes only its box of each JPEG (the same pixels; docs/loader.md)."""

    fast: bool = False
    scale_on_decode: bool = True
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    region: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_pixels", check_max_pixels(self.max_pixels))


def _steps(t: Transform) -> list[Transform]:
    """The steps of a chain run one after another: only a ``Compose`` is flattened (the branches
    of ``RandomChoice``/``OneOf`` are alternatives, and their own ``output_spec`` merges them)."""
    if isinstance(t, Compose):  # its steps are a tuple of Transforms (Compose.__post_init__)
        return [s for step in t.transforms for s in _steps(step)]
    return [t]


def _chain_spec(t: Transform, spec: ArraySpec, *, what: str, learnt: bool = False) -> ArraySpec:
    """Walk ``t``'s steps, naming the one that fails. ``learnt``: a plain function that does
    not say its size keeps it (the loader learns it from a sample, ``learned_output``)."""
    for step in _steps(t):
        if learnt and isinstance(step, FnTransform) and step.output is None:
            continue
        name = type(step).__name__
        fn = getattr(step, "output_spec", None)
        if fn is None:
            raise SpecError(
                f"{what}: step {name} has no output_spec; wrap plain functions with "
                "stoker.transforms.as_transform"
            )
        try:
            new = fn(spec)
        except SpecError as e:
            raise SpecError(f"{what}: step {name} does not accept {spec.describe()}: {e}") from e
        if not isinstance(new, ArraySpec):
            raise SpecError(
                f"{what}: {name}.output_spec returned {type(new).__name__}, not ArraySpec"
            )
        spec = new
    return spec


def size_lost(t: Transform | None, spec: ArraySpec) -> str | None:
    """When a plain function in ``t`` (without ``output=``) leaves open the height or width an
    earlier step fixed, words naming both steps and the fix (ending in ``;``); else ``None``."""
    fixed_by = None
    for i, step in enumerate(_steps(t) if t is not None else ()):
        try:
            new = step.output_spec(spec)
        except Exception:  # noqa: BLE001 - the chain's own check names this step
            return None
        if len(new.shape) >= 2 and None not in new.shape[:2]:
            fixed_by = f"step {i} ({type(step).__name__}) gives ({new.shape[0]}x{new.shape[1]})"
        elif fixed_by is not None:
            if not isinstance(step, FnTransform):
                return None
            return (
                f"step {i} ({step!r}) loses the size that {fixed_by}: the size a plain function "
                f'returns is unknown; when it keeps the shape, say so: {repr(step)[:-1]}, output="same");'
            )
        spec = new
    return None


def _open_dims(spec: ArraySpec, variable_width: bool, variable_height: bool) -> set[int]:
    """The dimensions of a chain's end left open that a batch cannot take open."""
    allowed = {1} if variable_width or variable_height else set()
    if variable_height:
        allowed.add(0)
    return {i for i, d in enumerate(spec.shape) if d is None} - allowed


def leaves_size_open(
    input_spec: ArraySpec,
    transforms: Transform | None,
    *,
    variable_width: bool = False,
    variable_height: bool = False,
    learnt: bool = False,
) -> bool:
    """Whether ``transforms`` fed ``input_spec`` end in a height or width a batch cannot take
    open: then a :class:`Pipeline` refuses them, unless the input's size is fixed (the loader
    fixes it when every image of a set has one size; ``learnt``: as :func:`_chain_spec`). A
    chain refused for another reason (a step that does not accept its input, a sample neither
    HW nor HWC) gives ``False``: the pipeline names that reason itself."""
    spec = input_spec
    if transforms is not None:
        try:
            spec = _chain_spec(transforms, spec, what="transforms", learnt=learnt)
        except SpecError:
            return False
    if len(spec.shape) not in (2, 3):
        return False
    return bool(_open_dims(spec, variable_width, variable_height) & {0, 1})


def fit_width(img: np.ndarray, width: int) -> np.ndarray:
    """(H, w, ...) -> (H, width, ...): zero right-pad when narrower, resize the width when wider."""
    w = img.shape[1]
    if w == width:
        return img
    if w < width:
        out = np.zeros((img.shape[0], width, *img.shape[2:]), dtype=img.dtype)
        out[:, :w] = img
        return out
    import cv2

    src = img if img.dtype != np.float16 else img.astype(np.float32)
    res = cv2.resize(np.ascontiguousarray(src), (width, img.shape[0]), interpolation=cv2.INTER_AREA)
    if res.ndim < img.ndim:
        res = res[..., None]
    return res.astype(img.dtype, copy=False)


def fit_height(img: np.ndarray, height: int) -> np.ndarray:
    """(h, W, ...) -> (height, W, ...): zero bottom-pad. A taller sample is a ``SpecError``: the
    loader sizes a batch's height from the chain's exact ``output_spec`` of its samples."""
    h = img.shape[0]
    if h == height:
        return img
    if h > height:
        raise SpecError(f"a sample {h} rows high does not fit the batch's height {height}")
    out = np.zeros((height, *img.shape[1:]), dtype=img.dtype)
    out[:h] = img
    return out


@dataclass(frozen=True)
class Pipeline:
    """See the module docstring. ``sample_spec`` is one transformed sample (HWC or HW);
    ``variable_width=True`` lets the width stay open (a sampler gives it per batch);
    ``variable_height=True`` the height too (each batch is padded to its largest sample);
    ``geometry``: the kinds of geometric fields the samples carry (``"boxes"``, ``"points"``,
    ``"mask"``), which every step must be able to move. ``input_from``: where a fixed
    ``input_spec`` of stored images came from (``"key 0 (position 0), the set's first
    image"``), set when the loader fixed it; every image is then checked against it before
    the transforms, and one of another size is a ``SpecError`` naming both sizes. ``fuse``:
    let a recognised chain head run as one op (``stoker.transforms.fused``); ``False`` runs
    every step on its own, the reference the fused op is tested and measured against.
    ``mix``: a batch mixer (:mod:`stoker.transforms.mix`) the worker that fills a chunk of a
    batch runs on the chunk's rows (no ``pair_with``, no fields). ``per_set``: a mixture's
    chains one per set (``stoker.transforms.PerSet``): each set's pipeline, this one being set
    0's; the worker runs each sample through its set's (``MixtureSource.set_of``)."""

    input_spec: ArraySpec
    transforms: Transform | None = None
    pair_with: Transform | None = None
    layout: str = "NHWC"
    decode: DecodeOptions = field(default_factory=DecodeOptions)
    variable_width: bool = False
    variable_height: bool = False
    geometry: frozenset[str] = frozenset()
    input_from: str = ""
    fuse: bool = True
    #: the sample where the chain leaves its size open only because a plain function does not
    #: say it (``shape.learned_output``, from the set's first image); each is checked against it
    learned: ArraySpec | None = None
    mix: BatchMix | None = None
    per_set: tuple[Pipeline, ...] = ()
    sample_spec: ArraySpec = field(init=False)
    # fill_row's fast paths (see _split_tail): a trailing Normalize writes straight into the
    # batch row; a recognised head (resize, crop, flip) runs as one op.
    _head: Transform | None = field(init=False, default=None, repr=False, compare=False)
    _head_spec: ArraySpec | None = field(init=False, default=None, repr=False, compare=False)
    _tail: Normalize | None = field(init=False, default=None, repr=False, compare=False)
    _fused: FusedCrop | None = field(init=False, default=None, repr=False, compare=False)
    _scaled_sizes: frozenset = field(init=False, default=frozenset(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.input_spec, ArraySpec):
            raise TypeError(
                f"input_spec must be an ArraySpec, got {type(self.input_spec).__name__}"
            )
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        for name in ("transforms", "pair_with"):
            t = getattr(self, name)
            if t is not None and not (callable(t) and hasattr(t, "output_spec")):
                raise TypeError(
                    f"{name} must be a stoker Transform (callable with output_spec), got "
                    f"{type(t).__name__}; wrap plain functions with stoker.transforms.as_transform"
                )
        spec = self.input_spec
        if self.transforms is not None:
            spec = _chain_spec(self.transforms, spec, what="transforms")
        if self.pair_with is not None:
            pspec = _chain_spec(self.pair_with, spec, what="pair_with")
            if pspec != spec:
                raise SpecError(
                    f"pair_with must keep the sample's shape and dtype: transforms give "
                    f"{spec.describe()}, pair_with turns that into {pspec.describe()}"
                )
        if self.learned is not None and _open_dims(spec, self.variable_width, self.variable_height):
            spec = self.learned
        if len(spec.shape) not in (2, 3):
            raise SpecError(
                f"the chain ends in {spec.describe()}; a sample must be (H, W) or (H, W, C)"
            )
        if _open_dims(spec, self.variable_width, self.variable_height):
            last = (
                type(_steps(self.transforms)[-1]).__name__ if self.transforms else "no transforms"
            )
            hint = size_lost(self.transforms, self.input_spec) or (
                "RandomCrop/Resize missing?" if self.transforms else "add a Resize or RandomCrop:"
            )
            raise SpecError(
                f"{hint} the chain ends in {spec.describe()} (last step: {last}); the loader "
                "needs a fixed shape to allocate batch slots"
            )
        object.__setattr__(self, "sample_spec", spec)
        object.__setattr__(self, "geometry", frozenset(self.geometry))
        if self.mix is not None and (
            not isinstance(self.mix, BatchMix) or self.pair_with is not None or self.geometry
        ):
            raise SpecError(
                "mix takes a stoker.transforms MixUp, CutMix or MixUpCutMix, on batches of "
                f"image and label only (no pair_with, no fields); got {self.mix!r}"
            )
        h, w = self.input_spec.shape[:2] if self.input_from else (None, None)
        scaled = (
            {(-(-h * k // 8), -(-w * k // 8)) for k in range(1, 8)}
            if self.decode.scale_on_decode and h is not None and w is not None
            else set()
        )  # the set's one size as a reduced-scale decode gives it: k/8 of it, rounded up
        object.__setattr__(self, "_scaled_sizes", frozenset(scaled))
        if self.geometry:
            self._check_geometry()
        self._split_tail()

    def _check_geometry(self) -> None:
        """Every step must say how it moves the samples' boxes, points and masks (a plain
        function cannot), and no ``pair_with`` (its rows would need their own fields)."""
        if self.pair_with is not None:
            raise SpecError("pair_with works on image and label only; these samples carry fields")
        if self.transforms is None:
            return
        for step in _steps(self.transforms):
            check = getattr(step, "check_targets", None)
            if check is None:
                raise SpecError(
                    f"transforms: step {type(step).__name__} cannot carry "
                    f"{', '.join(sorted(self.geometry))}: it is not a stoker Transform"
                )
            try:
                check(self.geometry)
            except SpecError as e:
                raise SpecError(f"transforms: step {type(step).__name__}: {e}") from e

    def _split_tail(self) -> None:
        """Without ``pair_with``, on uint8 input, pick the rows' fast paths:

        - a chain ending in ``Normalize`` (HWC, float32): ``fill_row`` runs the rest of the
          chain and lets the Normalize write ``x * gain + bias`` straight into the batch row,
          in the batch's layout: no float intermediate, no transposing copy;
        - a head that :func:`stoker.transforms.fused.fuse` recognises (``Resize`` then a crop,
          ``RandomResizedCrop``, each with an optional ``HorizontalFlip``) with nothing after
          it but that ``Normalize``: it runs as one op that resizes only the kept window and
          mirrors straight into the row (or into the Normalize's input).

        The draws are those of the plain chain; the bits are those of running the chain and
        placing the result (the fused resize within the tolerance in docs/transforms.md)."""
        if self.transforms is None or self.pair_with is not None:
            return
        steps = _steps(self.transforms)
        last = steps[-1] if steps else None
        tail: Normalize | None = None
        if type(last) is Normalize and last.layout == "HWC" and last.dtype == "float32":
            tail = last
        head_steps = steps[:-1] if tail is not None else steps
        head = Compose(head_steps) if head_steps else None
        head_spec = self.input_spec
        if head is not None:
            head_spec = _chain_spec(head, head_spec, what="transforms")
        if head_spec.dtype != "uint8" or not head_spec.fixed:
            return
        fused = fuse(head_steps) if self.fuse else None
        if fused is not None and fused[1] == len(head_steps):
            object.__setattr__(self, "_fused", fused[0])
        elif tail is None:
            return
        object.__setattr__(self, "_head", head)
        object.__setattr__(self, "_head_spec", head_spec)
        object.__setattr__(self, "_tail", tail)

    # ------------------------------------------------------------------ shapes
    @property
    def dtype(self) -> str:
        return self.sample_spec.dtype

    def row_shape(self, width: int | None = None, height: int | None = None) -> tuple[int, ...]:
        """Shape of one batch row at ``width`` and ``height`` (default: the chain's own),
        layout applied."""
        dims = list(self.sample_spec.shape)
        if width is not None:
            dims[1] = int(width)
        if height is not None:
            dims[0] = int(height)
        if dims[1] is None:
            raise SpecError("this pipeline's width varies; a width is needed for a batch row")
        if dims[0] is None:
            raise SpecError("this pipeline's height varies; a height is needed for a batch row")
        shape = [int(d) for d in dims if d is not None]
        if self.layout == "NCHW":
            if len(shape) == 2:
                return (1, shape[0], shape[1])
            return (shape[2], shape[0], shape[1])
        return tuple(shape)

    def output_spec(self, width: int | None = None) -> ArraySpec:
        """ArraySpec of one batch row (layout applied)."""
        return ArraySpec(self.row_shape(width), self.dtype)

    def frame(self, width: int | None = None, height: int | None = None) -> tuple[int, int]:
        """(height, width) of one sample in a batch at ``width`` and ``height`` (a mask's)."""
        h, w = self.sample_spec.shape[:2]
        h, w = (h if height is None else height), (w if width is None else width)
        if h is None or w is None:
            raise SpecError("this pipeline's sample size varies; a batch frame is needed")
        return int(h), int(w)

    def output_hw(self, hw: tuple[int, int]) -> tuple[int, int]:
        """(height, width) the chain makes of a stored image of ``hw`` (exact: the steps'
        ``output_spec``); ``SpecError`` naming the chain when it leaves a size open."""
        shape = (int(hw[0]), int(hw[1]), *self.input_spec.shape[2:])
        spec = ArraySpec(shape, self.input_spec.dtype)
        if self.transforms is not None:
            spec = _chain_spec(self.transforms, spec, what="transforms")
        h, w = spec.shape[:2]
        if h is None or w is None:
            raise SpecError(
                f"the transforms make {spec.describe()} of a {hw[0]}x{hw[1]} image: batches "
                "padded to their largest sample need a chain whose output size follows from "
                "its input size (no random-size step)"
            )
        return int(h), int(w)

    # ------------------------------------------------------------------ work
    def decode_image(self, buf: Any) -> np.ndarray:
        """Decode one encoded sample, at reduced JPEG scale when the transforms allow it."""
        return self.decoder()(buf)

    def decoder(self, region: bool = False) -> Callable[[Any], np.ndarray]:
        """``decode_image`` as a function for a hot loop, made once per process (it does not
        travel with the pipeline to a worker): :func:`stoker.codecs.decoder`. ``region``: for
        the row writer, which slices a ``JpegImage`` (``DecodeOptions.region``) as it crops."""
        crop = getattr(self._fused, "crop", None)  # the row writer slices its box of a JpegImage
        boxes = region and self.decode.region and type(crop) is RandomResizedCrop
        name = "_region_fn" if boxes else "_decoder_fn"
        fn = self.__dict__.get(name)
        if fn is None:
            # the hint is asked with the size from the JPEG header that decode parses anyway
            d = self.decode
            hint = getattr(self.transforms, "decode_hint", None) if d.scale_on_decode else None
            fn = _decoder(min_size=hint, fast=d.fast, max_pixels=d.max_pixels, region=boxes)
            object.__setattr__(self, name, fn)
        return fn

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_decoder_fn", "_region_fn", "_row_fn"):  # closures: made per process
            state.pop(name, None)
        return state

    def apply(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return img if self.transforms is None else self.transforms(img, rng)

    def apply_pair(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.pair_with is None:
            raise ValueError("this pipeline has no pair_with")
        return self.pair_with(img, rng)

    def check_input(self, img: np.ndarray, *, what: str, args: tuple = ()) -> None:
        """With ``input_from`` set, ``SpecError`` naming the sample when the stored image
        ``img`` is not of the set's one size."""
        if self.input_spec.accepts(img):
            return
        h, w = self.input_spec.shape[:2]
        if img.shape[:2] in self._scaled_sizes and img.shape[2:] == self.input_spec.shape[2:]:
            return  # decoded at a reduced scale (the transforms' decode_hint)
        raise SpecError(
            f"{what.format(*args)}: the image is {img.shape[0]}x{img.shape[1]} "
            f"({tuple(img.shape)} {img.dtype}), but this loader takes every image to be "
            f"{h}x{w}, the size of {self.input_from}, because no transforms fix the size; "
            "add a Resize or RandomCrop for a set of mixed sizes (or on_error='skip' to drop "
            "the odd ones)"
        )

    def check(self, arr: Any, *, what: str, args: tuple = ()) -> np.ndarray:
        """``arr`` as an ndarray matching ``sample_spec``, or ``SpecError`` naming
        ``what.format(*args)`` (formatted only then: this runs for every sample)."""
        if isinstance(arr, np.ndarray) and self.sample_spec.accepts(arr):
            return arr
        self._fail(arr, self.sample_spec, what, args)

    @staticmethod
    def _fail(arr: Any, spec: ArraySpec, what: str, args: tuple) -> NoReturn:
        where = what.format(*args)
        if not isinstance(arr, np.ndarray):
            raise SpecError(
                f"{where}: the transforms returned {type(arr).__name__}, not an ndarray"
            )
        raise SpecError(f"{where}: got {tuple(arr.shape)} {arr.dtype}, expected {spec.describe()}")

    def fill_row(
        self,
        img: np.ndarray,
        rng: np.random.Generator,
        dest: np.ndarray,
        width: int | None,
        *,
        what: str,
        args: tuple = (),
        height: int | None = None,
    ) -> np.ndarray | None:
        """The per-sample job after decoding: transforms, check, place into batch row ``dest``.

        Returns the checked sample (``pair_with`` starts from it), or ``None`` when a fast path
        (a trailing ``Normalize``, a fused head) wrote straight into ``dest`` (never with
        ``pair_with``)."""
        if self.input_from:
            self.check_input(img, what=what, args=args)
        spec = self._head_spec
        if (
            spec is not None
            and (width is None or width == self.sample_spec.shape[1])
            and height is None
        ):
            self._fill_fast(img, rng, dest, spec, what, args)
            return None
        out = self.check(self.apply(img, rng), what=what, args=args)
        self.place(out, dest, width, height)
        return out

    def row_writer(self, width: int | None = None, height: int | None = None) -> RowWriter | None:
        """For a worker's loop over a chunk: ``f(img, rng, dest, first=None)`` that writes a sample
        through the fused head (:meth:`stoker.transforms.fused.FusedCrop.row_writer`)
        straight into its batch row and returns ``True``, or returns ``False`` before any
        draw when the image is not the common case, which ``fill_row`` then handles with the
        same ``rng``; ``None`` when this pipeline has no fused head, or the batch has a width
        or height of its own. Made once per process (it does not travel to a worker)."""
        if height is not None or (width is not None and width != self.sample_spec.shape[1]):
            return None
        if "_row_fn" not in self.__dict__:  # decided once: the head never changes
            fused, spec = self._fused, self._head_spec
            fn = None
            if (
                fused is not None
                and spec is not None
                and len(spec.shape) == 3
                and spec.shape[2] in (3, 4)  # what the row writer takes (OpenCV drops a 1)
                and not self.input_from
            ):
                fn = fused.row_writer(
                    chw=self.layout == "NCHW", tail=self._tail, channels=int(spec.shape[2] or 0)
                )
            object.__setattr__(self, "_row_fn", fn)
        return self.__dict__["_row_fn"]

    def row_draws_first_block(self) -> bool:
        """Whether :meth:`row_writer`'s writer takes every draw from the first block of the
        sample's stream, given as ``first`` (``FusedCrop.draws_first_block``)."""
        return self._fused is not None and self._fused.draws_first_block

    def _fill_fast(
        self,
        img: np.ndarray,
        rng: np.random.Generator,
        dest: np.ndarray,
        spec: ArraySpec,
        what: str,
        args: tuple,
    ) -> None:
        """``fill_row``'s fast paths (see ``_split_tail``)."""
        tail, fused, flip = self._tail, self._fused, False
        if fused is not None:
            row = self.row_writer()
            if row is not None and row(img, rng, dest):
                return
            head, flip = fused.crop_and_flip(img, rng)
        else:
            head = img if self._head is None else self._head(img, rng)
        if not (isinstance(head, np.ndarray) and spec.accepts(head)):
            self._fail(head, spec, what, args)
        chw = self.layout == "NCHW"
        if tail is not None or head.ndim == 3 or not chw:
            write_head(head, dest, flip=flip, chw=chw, tail=tail)
        else:
            self.place(mirror(head) if flip else head, dest, None)

    def carry_targets(
        self,
        img: np.ndarray,
        targets: Targets,
        rng: np.random.Generator,
        dest: np.ndarray,
        width: int | None,
        height: int | None,
        *,
        what: str,
        args: tuple = (),
    ) -> np.ndarray:
        """``fill_row`` for a sample with geometric fields: the chain's ``apply_targets`` (the
        same draws and image as ``fill_row``) moves ``targets`` in place; a width fitted by
        resizing scales them too. Afterwards ``targets.hw`` is the sample's size before any
        zero padding (bottom/right, which moves nothing)."""
        if self.input_from:
            self.check_input(img, what=what, args=args)
        t = self.transforms
        out = img if t is None else t.apply_targets(img, targets, rng)
        out = self.check(out, what=what, args=args)
        if width is not None and out.shape[1] > width:
            targets.rescale((out.shape[0], int(width)))
        self.place(out, dest, width, height)
        return out

    def place(
        self, arr: np.ndarray, dest: np.ndarray, width: int | None, height: int | None = None
    ) -> None:
        """Write checked sample ``arr`` into batch row ``dest`` (``row_shape(width, height)``)."""
        if height is not None and arr.shape[0] != height:
            arr = fit_height(arr, height)
        if width is not None and arr.shape[1] != width:
            arr = fit_width(arr, width)
        if self.layout == "NCHW":
            if arr.ndim == 3 and dest.shape == (arr.shape[2], *arr.shape[:2]):
                write_chw(arr, dest)
                return
            arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
        np.copyto(dest, arr, casting="no")
